"""Contexts (owned): ``ggml_init`` with ``no_alloc``, the metadata of tensors.

A :class:`Context` holds tensor metadata only; its tensors get memory from a backend buffer
with :meth:`Context.alloc`, or from the graph allocator when a graph is computed. It keeps its
own books through small methods:

- :meth:`build` is the one construction path of op results: room in this context, the ggml
  builder called there, the result wrapped as a tensor of this context;
- :meth:`uses` records the other contexts whose tensors this one's tensors read (operands
  from another context); :meth:`contexts` is everything a graph over its tensors touches;
- :meth:`keep` keeps graphs and schedulers that placed memory for its tensors, and hands their
  graphs back before it closes;
- :meth:`adopt` keeps buffers made for its tensors outside :meth:`alloc` (DLPack).

Threads: building tensors in one context from several threads is serialized by its lock.
"""
from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from . import _handle, _record_pool, _rewire, _types, _written
from ._backend import Backend
from ._buffer import Buffer
from ._device import BufferType
from ._handle import Owned, Placer
from ._rpc_liveness import buffer_device, ensure_alive
from ._loader import HELPERS, ffi, lib
from ._tensor import Tensor
from ._tensor_base import MAX_DIMS, MAX_NAME, TensorBase, index_of, shape_of
from .errors import (ClosedError, GGMLError, InvalidType, OutOfMemory,
                     check_ptr, check_status, require)

_OVERHEAD = int(lib.ggml_tensor_overhead())
_MAX_CAPACITY = 1 << 26


class _Export:
    """Held by each zero-copy export of a context's memory (see :meth:`Context.export`)."""

    __slots__ = ("ctx", "memory", "__weakref__")

    def __init__(self, ctx: "Context") -> None:
        self.ctx = ctx
        self.memory: list[Any] = []


def _records_left_py(raw: Any) -> int:
    """ggml_py_room for bindings without helpers.c."""
    return (int(lib.ggml_get_mem_size(raw)) - int(lib.ggml_used_mem(raw))) // _OVERHEAD - 1


_records_left: Callable[[Any], int] = (lib.ggml_py_room if HELPERS else None) or _records_left_py
# a Context's state for helpers.c's checked ops: its newest chunk and the mutex they build
# under (None for bindings without helpers.c)
_STATE_NEW: Any = lib.ggml_py_ctx_new if HELPERS else None
_C_LOCK: Any = lib.ggml_py_ctx_lock if HELPERS else None
_C_UNLOCK: Any = lib.ggml_py_ctx_unlock if HELPERS else None


def _init_view(p: Any) -> None:
    """A view of allocated memory is usable at once (called holding the context's lock: a
    buffer closing meanwhile takes it first, so the source's memory cannot go under ggml)."""
    src = p.view_src
    if src != ffi.NULL and src.buffer != ffi.NULL and p.buffer == ffi.NULL:
        ensure_alive(buffer_device(src.buffer))   # (init_tensor may be remote)
        lib.ggml_backend_view_init(p)


class Context(Owned):
    """Metadata for up to `capacity` tensors per chunk; a new chunk is opened when one fills,
    so the capacity grows as needed."""

    _kind = "context"
    #: ``Context.pool_limit(n_bytes)``: how many bytes of freed chunks (this class's and
    #: graphs') are kept for reuse, 32 MiB by default; 0 keeps none. Returns the limit before.
    #: A program that builds its graph again and again (each token, each step) then writes
    #: its records into memory it touched before instead of fresh pages.
    pool_limit = staticmethod(_record_pool.pool_limit)

    def __init__(self, capacity: int = 4096) -> None:
        capacity = index_of(capacity, "Context: capacity")
        require(0 < capacity <= _MAX_CAPACITY,
                f"Context: capacity must be in 1..{_MAX_CAPACITY}, got {capacity}")
        self._capacity = capacity
        first = self._new_chunk()
        # every chunk (ggml_context), the first included: a new one opens when the last
        # fills. Plain handles, freed with this object (never with a Python object of their
        # own: one that kept this Context as its parent would make a cycle, and a Context of
        # more than one chunk would wait for the cyclic collector to give its memory back)
        self._chunks: list[Any] = [first]
        super().__init__(first, functools.partial(_record_pool.release_all, self._chunks))
        self._spans = [self._span(first)]
        self._head = first                 # the newest chunk, where tensors are made
        # the checked ops' side (helpers.c): the newest chunk, and a mutex held by a checked
        # op while it builds and by this object wherever it builds in, walks or closes its
        # chunks (_records), so ggml never sees two threads in one chunk. The handle that
        # every ggml_py_* checked op takes first (None for bindings without helpers.c):
        # read it (the ops call their helper with it: ops/_common.CHECKED_OPS), never assign it
        self.checked_state: Any = None
        if _STATE_NEW is not None:
            st = check_ptr(_STATE_NEW(first),
                           "Context: no memory for its state", OutOfMemory)
            self.checked_state = ffi.gc(st, lib.ggml_py_ctx_free)
        self._keep: list[Any] = []         # graphs/allocators/schedulers that placed memory here
        self._buffers: list[Buffer] = []   # buffers made for its tensors
        self._uses: set[Context] = set()   # other contexts its tensors read (strong)
        self._pending: list[tuple[Tensor, np.ndarray]] = []   # from_numpy values to set
        self._closing = False
        self._exports: weakref.WeakSet[_Export] = weakref.WeakSet()
        # split nodes of graphs with tensors here that a scheduler points at its copies
        self.rewired = _rewire.Record()
        self.books = _written.Books()      # which of its tensors hold written values

    # -- chunks ------------------------------------------------------------------------------
    def _new_chunk(self) -> Any:
        raw = _record_pool.new(_OVERHEAD * (self._capacity + 64))
        if raw == ffi.NULL:
            raise OutOfMemory(f"Context: ggml_init could not reserve room for {self._capacity} "
                              "tensors")
        return raw

    @staticmethod
    def _span(raw: Any) -> tuple[int, int]:
        base = int(ffi.cast("uintptr_t", lib.ggml_get_mem_buffer(raw)))
        return base, base + int(lib.ggml_get_mem_size(raw))

    def _room(self, n: int = 8) -> Any:
        """The raw chunk with room for `n` more tensors (opening a new chunk when needed).
        Callers hold the lock. Room is what ggml says is left (``_records_left``), the one
        count both the Python path and the checked ops read."""
        self.ptr                                # (ClosedError once closed)
        if _records_left(self._head) < n:
            raw = self._new_chunk()
            self._chunks.append(raw)
            self._spans.append(self._span(raw))
            self._head = raw
            if self.checked_state is not None:         # (the caller holds _records)
                lib.ggml_py_ctx_set_head(self.checked_state, raw)
        return self._head

    @contextlib.contextmanager
    def _records(self) -> Iterator[None]:
        """This context's lock, and the mutex its checked ops build under: held to build in,
        walk or change its chunks. Not held while Python code that could reach this context
        again runs (views' init, buffers, finalizers): the mutex is not re-entrant."""
        with self._lock:
            st = self.checked_state
            if st is None:
                yield
                return
            _C_LOCK(st)
            try:
                yield
            finally:
                _C_UNLOCK(st)

    def _raws(self) -> list[Any]:
        self.ptr                                # (ClosedError once closed)
        return list(self._chunks)

    def n_tensors(self) -> int:
        """How many tensors (ops, views, inputs) this context holds."""
        with self._records():
            # each record takes ggml_tensor_overhead() exactly (every pinned release), and a
            # Context's chunks hold tensor records only
            return sum(int(lib.ggml_used_mem(r)) for r in self._raws()) // _OVERHEAD

    def spans(self) -> list[tuple[int, int]]:
        """The address ranges of this context's tensor records, one per chunk."""
        return list(self._spans)

    def owns(self, raw_tensor: Any) -> bool:
        """Whether the raw tensor's metadata lives in this context's memory."""
        a = int(ffi.cast("uintptr_t", raw_tensor))
        return any(lo <= a < hi for lo, hi in self._spans)

    # -- the one construction path -------------------------------------------------------------
    def build(self, fn: Callable[..., Any], args: Iterable[Any], ndim: int | None,
              uses: Iterable[TensorBase] = (), room: int = 4, *, view: bool = False,
              like: TensorBase | None = None) -> Tensor:
        """``fn(raw_context, *args)`` in this context, wrapped as a tensor of this context.
        The contexts of `uses` (operands) are recorded as this context's dependencies.
        `view`: the result may be a view of allocated memory (made usable at once); `like`:
        an operand whose shape and type the (new, contiguous) result has."""
        for u in uses:
            if u.ctx is not self:
                p = self._build_shared(fn, args, uses, room, view)
                break
        else:                                   # (the common case: operands of this context)
            lock, st = self._lock, self.checked_state
            lock.acquire()                      # (cheaper than `with` on this hot path)
            try:
                if self._raw is None:
                    raise ClosedError("this tensor's context is closed")
                if st is None:
                    p = fn(self._room(room), *args)
                else:                           # (_records, inline)
                    _C_LOCK(st)
                    try:
                        p = fn(self._room(room), *args)
                    finally:
                        _C_UNLOCK(st)
                if view and p:
                    _init_view(p)
            finally:
                lock.release()
        if not p:                               # (NULL; cheaper than == ffi.NULL)
            raise GGMLError("ggml returned no tensor")
        if like is not None:
            tt, ne = like._type, like._ne
            if tt is not None and ne is not None and tt._block == 1:
                # a new tensor of like's type and shape: packed strides, contiguous
                shape = like._shape
                s = tt._size
                s1 = s * ne[0]
                s2 = s1 * ne[1]
                return Tensor(p, self, ndim, tt, ne, (s, s1, s2, s2 * ne[2]),
                              shape if shape is not None and len(shape) == ndim else None, True)
        return Tensor(p, self, ndim)

    def _build_shared(self, fn: Callable[..., Any], args: Iterable[Any],
                      uses: Iterable[TensorBase], room: int, view: bool) -> Any:
        """build() with operands of other contexts: they are recorded as this context's
        dependencies, and locked too, so another thread closing one of them waits until
        ggml has read the operand, and a context closed meanwhile raises here."""
        others = [u.ctx for u in uses if u.ctx is not self]
        for c in others:
            self.uses(c)
        locks = sorted({id(c): c for c in [self, *others]}.values(), key=id)
        with contextlib.ExitStack() as stack:
            for c in locks:
                stack.enter_context(c._lock)
                if c._raw is None:
                    raise ClosedError("an operand's context is closed")
            with self._records():
                p = fn(self._room(room), *args)
            if view and p:
                _init_view(p)
            return p

    def wrap(self, p: Any, ndim: int | None = None) -> Tensor:
        """A raw tensor of this context as a Tensor (InvalidArgument for NULL)."""
        return Tensor(p, self, ndim)

    def wrap_raw(self, p: Any) -> Tensor:
        """A raw tensor of this context or of one it uses, as a Tensor of its owner;
        ClosedError when that owner was closed."""
        for c in self.contexts(include_closed=True):
            if c.owns(p):
                if c.closed:
                    raise ClosedError("the context holding this tensor's operand is closed")
                return Tensor(p, c)
        # a tensor of none of ours: a copy a scheduler made in its own context (see _rewire)
        return Tensor(p, self)

    def uses(self, other: "Context") -> None:
        """Record that tensors of this context read tensors of `other`."""
        self._uses.add(other)

    def contexts(self, include_closed: bool = False) -> list["Context"]:
        """This context and every context it uses, directly or not."""
        seen: dict[int, Context] = {id(self): self}
        stack = [self]
        while stack:
            for c in stack.pop()._uses:
                if id(c) not in seen:
                    seen[id(c)] = c
                    stack.append(c)
        return [c for c in seen.values() if include_closed or not c.closed]

    def keep(self, obj: Any) -> None:
        """Keep `obj` (a graph, allocator or scheduler that placed memory for tensors here)
        alive with this context; a scheduler's graphs are handed back before it closes."""
        if not any(k is obj for k in self._keep):
            self._keep.append(obj)

    def export(self) -> "_Export":
        """A token for memory handed out without a copy (``numpy(copy=False)``, DLPack): while
        a token lives, close() leaves this context's memory (buffers, graph allocations) to
        the tokens, which free it when the last export is collected."""
        token = _Export(self)
        self._exports.add(token)
        # every owner of memory its tensors may sit in: its buffers, and the schedulers and
        # graphs that placed memory for them (each close() hands its memory to the token)
        for k in (*self._buffers, *self._keep,
                  *(a for g in self._keep if isinstance(g, Placer) for a in g.placed_memory())):
            if isinstance(k, Owned) and not k.closed:
                k.export_to(token)
        return token

    def adopt(self, buffer: Buffer) -> None:
        """Keep `buffer` (memory of some of this context's tensors) until the context closes."""
        self._buffers.append(buffer)
        self._children.add(buffer)

    # -- tensors -------------------------------------------------------------------------------
    def tensor(self, type: Any, shape: Any, name: str | None = None) -> Tensor:
        """A new tensor of ggml `type` (or numpy dtype) and numpy-order `shape` (1-4 axes)."""
        t = _types.of(type)
        dims = shape_of(shape, "tensor: shape")
        ne = list(reversed(dims))
        require(ne[0] % t.block_size == 0,
                f"tensor: the last axis ({ne[0]}) must be a multiple of {t.name}'s block size "
                f"{t.block_size}")
        if name is not None:
            require(isinstance(name, str), f"tensor: name must be a str, not "
                                           f"{name.__class__.__name__}", InvalidType)
            require("\0" not in name and len(name.encode()) < MAX_NAME,
                    f"tensor: name must be shorter than {MAX_NAME} bytes, without NUL")
        nbytes = t.row_size(ne[0]) if t.block_size > 1 else t.type_size
        for n in ne[1:] if t.block_size > 1 else ne:
            nbytes *= n
        require(nbytes < 2 ** 62, f"tensor: {dims} of {t.name} needs {nbytes} bytes, more than "
                                  "ggml can address", OutOfMemory)
        nes = ffi.new("int64_t[]", ne)
        with self._records():
            p = lib.ggml_new_tensor(self._room(1), t, len(ne), nes)
        # its facts, as ggml_new_tensor sets them: packed strides, contiguous
        ne4 = (*ne, 1, 1, 1)[:MAX_DIMS]
        s0 = t.type_size
        s1 = s0 * (ne4[0] // t.block_size)
        s2 = s1 * ne4[1]
        tensor = Tensor(p, self, len(dims), t, ne4, (s0, s1, s2, s2 * ne4[2]), dims, True)
        if name:
            tensor.name = name
        return tensor

    def from_numpy(self, array: Any, name: str | None = None) -> Tensor:
        """A new tensor shaped and typed like `array`. Its values (copied now) are set by the
        next :meth:`alloc` of this context, which gives the tensor its memory."""
        a = np.array(array, copy=True, order="C")
        require(a.dtype != object, "from_numpy: object arrays hold no numbers", InvalidType)
        t = self.tensor(_types.of(a.dtype), a.shape if a.ndim else (1,), name)
        self._pending.append((t, a.reshape(t.shape)))
        return t

    def constant(self, array: np.ndarray) -> Tensor:
        """A leaf holding a copy of `array` (the operand of ``t + array``, see
        docs/numpy-mixing.md): set by the next :meth:`alloc`, like :meth:`from_numpy`'s; once
        the context has memory, placed at once in a buffer of its own of the same type."""
        t = self.from_numpy(array)
        with self._lock:
            bufs = [b for b in self._buffers if b._raw is not None]
            if not bufs:
                return t
            buft = bufs[0].buffer_type
            p = t.ptr
            b = lib.ggml_backend_buft_alloc_buffer(
                buft.ptr, int(lib.ggml_backend_buft_get_alloc_size(buft.ptr, p)))
            if b == ffi.NULL:
                raise OutOfMemory(f"constant: allocating {t.nbytes} bytes in {buft.name} failed")
            buf = Buffer(b, buft, parents=(self,))
            buf.on_close(lambda b=b: self._lose(b))
            self._buffers.append(buf)
            st = lib.ggml_backend_tensor_alloc(b, p, lib.ggml_backend_buffer_get_base(b))
            if st:                           # an enum ggml_status where the release returns one
                check_status(st, "constant: placing the tensor")
            self._pending = [(u, a) for u, a in self._pending if u is not t]
        t.set(array.reshape(t.shape))
        return t

    @property
    def tensors(self) -> list[Tensor]:
        """Every tensor of the context (inputs, op results, views), in creation order."""
        with self._records():
            raws = [p for raw in self._raws() for p in self._chunk_raw_tensors(raw)]
        return [Tensor(p, self) for p in raws]

    def alloc(self, backend_or_buffer_type: Backend | BufferType) -> list[Buffer]:
        """Allocate every tensor not yet allocated in one buffer of the backend's default
        buffer type (or of the given buffer type), then set the values given to
        :meth:`from_numpy`. Returns the new buffers."""
        if isinstance(backend_or_buffer_type, Backend):
            buft = backend_or_buffer_type.default_buffer_type
        elif isinstance(backend_or_buffer_type, BufferType):
            buft = backend_or_buffer_type
        else:
            raise InvalidType("alloc: takes a Backend or a BufferType, not "
                              f"{type(backend_or_buffer_type).__name__}")
        buft.require_plain_bytes("alloc")
        ensure_alive(lib.ggml_backend_buft_get_device(buft.ptr))
        if buft.admits:       # (a meta device's buffer type: how each tensor is split)
            buft.admit([self.wrap_raw(p) for raw in self._raws()
                        for p in self._chunk_raw_tensors(raw)
                        if p.data == ffi.NULL and p.view_src == ffi.NULL])
        made = []
        with self._lock:
            for raw in self._raws():
                with self._records():
                    todo = [p for p in self._chunk_raw_tensors(raw)
                            if p.data == ffi.NULL and p.view_src == ffi.NULL]
                    if not todo:
                        continue
                    need = sum(int(lib.ggml_backend_buft_get_alloc_size(buft.ptr, p))
                               for p in todo)
                    b = lib.ggml_backend_alloc_ctx_tensors_from_buft(raw, buft.ptr)
                if b == ffi.NULL:
                    raise OutOfMemory(f"alloc: allocating the context's tensors in {buft.name} "
                                      f"failed ({need} bytes)")
                buf = Buffer(b, buft, parents=(self,))
                buf.on_close(lambda b=b: self._lose(b))
                made.append(buf)
            self._buffers.extend(made)   # the context owns its tensors' memory
        pending, self._pending = self._pending, []
        for t, a in pending:
            if t.is_allocated:
                t.set(a)
            else:
                self._pending.append((t, a))
        return made

    def _chunk_raw_tensors(self, raw: Any) -> list[Any]:
        out = []
        p = lib.ggml_get_first_tensor(raw)
        while p != ffi.NULL:
            out.append(p)
            p = lib.ggml_get_next_tensor(raw, p)
        return out

    def buffer_addresses(self) -> set[int]:
        """The raw addresses of the open buffers holding this context's tensors."""
        return {int(ffi.cast("uintptr_t", b._raw)) for b in self._buffers if b._raw is not None}

    def lose_placed(self, addrs: set[int]) -> None:
        """Memory a scheduler or allocator placed for the tensors at `addrs` is handed back: those tensors
        and every view of them here read as unallocated (a view made while its source held
        that memory would otherwise keep pointing into it)."""
        if self._raw is None:
            return
        null = ffi.NULL
        with self._records():
            self._lose_where(lambda p: int(ffi.cast("uintptr_t", p)) in addrs or (
                p.view_src != null and int(ffi.cast("uintptr_t", p.view_src)) in addrs))

    def _lose_where(self, placed_there: Callable[[Any], bool]) -> None:
        """Tensors of this context that `placed_there` picks read as unallocated (the caller
        holds _records)."""
        null = ffi.NULL
        for raw in self._raws():
            for p in self._chunk_raw_tensors(raw):
                if placed_there(p):
                    p.data = null
                    p.buffer = null

    def _lose(self, buf_raw: Any) -> None:
        """A buffer of this context is being freed: its tensors (and views of them) read as
        unallocated from now on, so they raise instead of touching freed memory."""
        if self._closing or self._raw is None:
            return
        with self._records():
            self._lose_where(lambda p: p.buffer == buf_raw)

    def _devices(self) -> set[Any]:
        return set().union(*(b._devices() for b in self._buffers)) if self._buffers else set()

    def close(self) -> None:
        """Free the context and the memory of its tensors (idempotent); graphs over it close first."""
        with self._lock:
            if self._raw is None:
                return
            if self.checked_state is not None:     # checked ops refuse from now on
                _C_LOCK(self.checked_state)
                lib.ggml_py_ctx_set_head(self.checked_state, ffi.NULL)
                _C_UNLOCK(self.checked_state)
            for k in self._keep:   # schedulers give graphs with nodes here back before they go
                if isinstance(k, Placer):
                    k.context_closing()
            self._closing = True
            exports = list(self._exports)
            if exports:
                # memory handed out without a copy outlives close(): the exports own it now
                memory = [*self._buffers, *(a for k in self._keep if isinstance(k, Placer)
                                            for a in k.placed_memory())]
                for m in memory:
                    self._children.discard(m)
                    m._parents = ()
                for token in exports:
                    token.memory.extend(memory)
            self._keep = []
            # the tensors' metadata (this context's ggml memory) is freed when the Context
            # object is collected, not here: a Tensor, a Graph or a context that reads these
            # tensors keeps it, so a thread that checked "open" just before this close, or
            # ggml walking a closed operand's record, reads a record instead of freed memory
            # (data is what close() frees: the buffers; the records then raise ClosedError)
            if _handle.detach(self._finalizer) is not None:   # (once: a close retried after a
                self._records_finalizer = _handle.finalize(   # child raised)
                    self, _record_pool.release_all, self._chunks)
            super().close()        # closes the chunks and buffers (children) first
            self._buffers = []
            self._pending = []

    def __repr__(self) -> str:
        return "<Context closed>" if self.closed else f"<Context chunks={len(self._chunks)}>"


__all__ = ["Context"]
