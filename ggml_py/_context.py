"""Contexts (owned): ``ggml_init`` with ``no_alloc``, the metadata of tensors.

A :class:`Context` holds tensor metadata only; its tensors get memory from a backend buffer
with :meth:`Context.alloc`, or from the graph allocator when a graph is computed. It keeps its
own books through small methods, in the words of docs/ownership.md:

- :meth:`build` is the one construction path of op results: room in this context, the ggml
  builder called there, the result wrapped as a tensor of this context;
- :meth:`keep` keeps alive, never closing them, the other contexts whose tensors this one's
  tensors read (:meth:`contexts` is everything a graph over its tensors touches) and the
  graphs and schedulers that placed memory for its tensors (they give their graphs back
  before it closes);
- :meth:`own` takes buffers made for its tensors outside :meth:`alloc` (DLPack, GGUF
  mappings): closed with it;
- :meth:`export` makes the token of a zero-copy export of its tensors' memory.

Threads: building tensors in one context from several threads is serialized by its lock.
"""
from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Callable, Iterable, Iterator, cast

import numpy as np

from . import _record_pool, _rewire, _types, _written
from ._backend import Backend
from ._buffer import Buffer
from ._device import BufferType
from ._context_records import C_LOCK, C_UNLOCK, Records
from ._handle import Export, Placer
from ._rpc_liveness import buffer_device, ensure_alive
from ._loader import ffi, lib
from ._tensor import Tensor
from ._tensor_base import MAX_DIMS, MAX_NAME, TensorBase, index_of, shape_of
from .errors import (ClosedError, GGMLError, InvalidArgument, InvalidType, OutOfMemory,
                     check_status, require)

_MAX_CAPACITY = 1 << 26


#: Set by :mod:`ggml_py._meta_plan` once a meta device exists: refuses a view of a meta
#: device's memory whose split ggml cannot derive (a meta buffer derives it when the view is
#: initialised, and aborts the process on one it cannot map: "view of permuted tensor").
meta_view_check: Callable[[Any], None] | None = None


def _init_view(p: Any) -> None:
    """A view of allocated memory is usable at once (called holding the context's lock: a
    buffer closing meanwhile takes it first, so the source's memory cannot go under ggml)."""
    src = p.view_src
    if src != ffi.NULL and src.buffer != ffi.NULL and p.buffer == ffi.NULL:
        ensure_alive(buffer_device(src.buffer))   # (init_tensor may be remote)
        if meta_view_check is not None:
            meta_view_check(p)
        lib.ggml_backend_view_init(p)


class Context(Records):
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
        super().__init__(capacity)
        self._keep: list[Any] = []         # graphs/allocators/schedulers that placed memory here
        self._buffers: list[Buffer] = []   # buffers made for its tensors
        self._uses: set[Context] = set()   # other contexts its tensors read (strong)
        self._pending: list[tuple[Tensor, np.ndarray]] = []   # from_numpy values to set
        self.on_close(self._teardown)
        self.on_close(self._buffers.clear, after_free=True)
        # split nodes of graphs with tensors here that a scheduler points at its copies
        self.rewired = _rewire.Record()
        self.books = _written.Books()      # which of its tensors hold written values

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
                    C_LOCK(st)
                    try:
                        p = fn(self._room(room), *args)
                    finally:
                        C_UNLOCK(st)
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
        others = [cast("Context", u.ctx) for u in uses if u.ctx is not self]
        for c in others:
            self.keep(c)
        locks = sorted({id(c): c for c in [self, *others]}.values(), key=id)
        with contextlib.ExitStack() as stack:
            for c in locks:
                stack.enter_context(c.lock)
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
        """Keep `obj` alive while this context lives, never closing it: a context whose tensors
        tensors here read, or a graph, allocator or scheduler that placed memory for tensors
        here (a :class:`Placer` is told before this context's buffers close)."""
        if isinstance(obj, Context):
            self._uses.add(obj)
        elif not any(k is obj for k in self._keep):
            self._keep.append(obj)

    def export(self) -> Export:
        """The token of memory handed out without a copy (``numpy(copy=False)``, DLPack), held
        by the export: while it lives, closing an owner of memory its tensors may sit in (its
        buffers, the schedulers and graph allocators that placed memory for them) leaves that
        memory to it, and the last export collected frees it."""
        return Export((*self._buffers, *self._keep, *(
            a for g in self._keep if isinstance(g, Placer) for a in g.placed_memory())))

    def own(self, buffer: Buffer) -> None:
        """Own `buffer` (memory of some of this context's tensors made outside :meth:`alloc`):
        it is closed with the context."""
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
            buf.on_close(functools.partial(self._lose, b))
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
            # ggml's meta buffer type places EVERY tensor of the context in the new buffer
            # (0.26.0's alloc_buffer_n), memory already placed included: a second alloc
            # would move those tensors into fresh, unset memory and lose their values
            placed = [p for raw in self._raws() for p in self._chunk_raw_tensors(raw)
                      if p.data != ffi.NULL or p.buffer != ffi.NULL]
            if placed:
                raise InvalidArgument(
                    f"alloc: a meta device's buffer takes every tensor of the context, and "
                    f"{len(placed)} of this context's tensors already have memory (e.g. "
                    f"{self.wrap_raw(placed[0]).name or '(unnamed)'!r}): ggml would move them "
                    "into new, unset memory; make the new tensors in a new Context")
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
                buf.on_close(functools.partial(self._lose, b))
                made.append(buf)
            self._buffers.extend(made)   # the context owns its tensors' memory
        pending, self._pending = self._pending, []
        for t, a in pending:
            if t.is_allocated:
                t.set(a)
            else:
                self._pending.append((t, a))
        return made

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

    def _teardown(self) -> None:
        """A step of close(): schedulers give back the graphs with nodes here before the
        buffers go."""
        keep, self._keep = self._keep, []
        for k in keep:
            if isinstance(k, Placer):
                k.context_closing()
        self._pending = []

    def __repr__(self) -> str:
        return "<Context closed>" if self.closed else f"<Context chunks={len(self._chunks)}>"


__all__ = ["Context"]
