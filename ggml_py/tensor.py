"""Contexts (owned) and tensors: ``ggml_init`` / ``ggml_new_tensor`` and friends.

A :class:`Context` holds tensor metadata only (ggml's ``no_alloc``); its tensors get memory
from a backend buffer with :meth:`Context.alloc`, or from the graph allocator when a graph is
computed. Shapes are in numpy order (slowest axis first); ``t.ne``/``t.nb`` are ggml's order.

    >>> ctx = gg.Context()                         # doctest: +SKIP
    >>> a = ctx.tensor(gg.f32, (2, 3)); ctx.alloc(gg.device("CPU").backend())
    >>> a.set(np.ones((2, 3), np.float32)); a.numpy()
"""
from __future__ import annotations

import numpy as np

from . import types as T
from ._handle import Owned
from ._loader import cstr, ffi, lib
from .buffer import Buffer
from .registry import buffer_device, ensure_alive
from .errors import ClosedError, GGMLError, InvalidArgument, InvalidType, require

MAX_DIMS = int(lib.GGML_MAX_DIMS)


class Context(Owned):
    """Metadata for up to `capacity` tensors per chunk; a new chunk is opened when one fills,
    so the capacity grows as needed."""

    _kind = "context"

    def __init__(self, capacity: int = 4096):
        require(isinstance(capacity, int) and capacity > 0, "capacity must be a positive int")
        self._capacity = capacity
        first = self._new_chunk()
        super().__init__(first, lib.ggml_free)
        self._extra = []          # further chunks: Contexts of their own, closed with this one
        self._chunk_of = None
        self._keep = []           # graphs/allocators whose memory tensors of this context use
        self._buffers = []        # buffers made by alloc()

    def _new_chunk(self):
        overhead = int(lib.ggml_tensor_overhead())
        params = ffi.new("struct ggml_init_params *",
                         {"mem_size": overhead * (self._capacity + 8), "mem_buffer": ffi.NULL,
                          "no_alloc": True})
        raw = lib.ggml_init(params[0])
        if raw == ffi.NULL:
            raise GGMLError("ggml_init failed")
        return raw

    def _room(self, n: int = 8):
        """The raw chunk with room for `n` more tensors (opening a new chunk when needed)."""
        raw = self._extra[-1].ptr if self._extra else self.ptr
        if int(lib.ggml_get_mem_size(raw)) - int(lib.ggml_used_mem(raw)) < n * int(lib.ggml_tensor_overhead()):
            chunk = Context.__new__(Context)
            chunk._capacity = self._capacity
            Owned.__init__(chunk, self._new_chunk(), lib.ggml_free, parents=(self,))
            chunk._extra, chunk._keep, chunk._buffers = [], [], []
            chunk._chunk_of = self
            self._extra.append(chunk)
            raw = chunk.ptr
        return raw

    def _raws(self):
        return [self.ptr] + [c.ptr for c in self._extra]

    def tensor(self, type, shape, name: str | None = None) -> "Tensor":
        """A new tensor of ggml `type` (or numpy dtype) and numpy-order `shape` (1-4 axes)."""
        t = T.of(type)
        shape = _shape(shape)
        ne = list(reversed(shape))
        require(ne[0] % t.block_size == 0,
                f"the last axis ({ne[0]}) must be a multiple of {t.name}'s block size {t.block_size}")
        raw = self._room(1)
        nes = ffi.new("int64_t[]", ne)
        p = lib.ggml_new_tensor(raw, t, len(ne), nes)
        tensor = Tensor(p, self, ndim=len(shape))
        if name:
            tensor.name = name
        return tensor

    def from_numpy(self, array, name: str | None = None) -> "Tensor":
        """A tensor shaped and typed like `array` (data is set once the context is allocated)."""
        a = np.asarray(array)
        return self.tensor(T.of(a.dtype), a.shape, name)

    @property
    def tensors(self) -> list["Tensor"]:
        out = []
        for raw in self._raws():
            p = lib.ggml_get_first_tensor(raw)
            while p != ffi.NULL:
                out.append(Tensor(p, self))
                p = lib.ggml_get_next_tensor(raw, p)
        return out

    def alloc(self, backend_or_buffer_type) -> list[Buffer]:
        """Allocate every tensor not yet allocated in one buffer of the backend's default
        buffer type (or of the given buffer type). Returns the new buffers."""
        from .backend import Backend
        from .buffer import BufferType
        if isinstance(backend_or_buffer_type, Backend):
            buft = BufferType(lib.ggml_backend_get_default_buffer_type(backend_or_buffer_type.ptr))
        elif isinstance(backend_or_buffer_type, BufferType):
            buft = backend_or_buffer_type
        else:
            raise InvalidArgument("alloc takes a Backend or a BufferType")
        ensure_alive(lib.ggml_backend_buft_get_device(buft.ptr))
        made = []
        for raw in self._raws():
            if not any(t.data is None and t._view_src is None for t in self._chunk_tensors(raw)):
                continue
            need = sum(buft.alloc_size(t) for t in self._chunk_tensors(raw) if t.data is None)
            b = lib.ggml_backend_alloc_ctx_tensors_from_buft(raw, buft.ptr)
            if b == ffi.NULL:
                raise GGMLError(f"allocating the context's tensors in {buft.name} failed "
                                f"({need} bytes)")
            made.append(Buffer(b, parents=(self,)))
        self._buffers.extend(made)   # the context owns its tensors' memory
        return made

    def _devices(self) -> set:
        return set().union(*(b._devices() for b in self._buffers)) if self._buffers else set()

    def _chunk_tensors(self, raw):
        p = lib.ggml_get_first_tensor(raw)
        while p != ffi.NULL:
            yield Tensor(p, self)
            p = lib.ggml_get_next_tensor(raw, p)

    def close(self) -> None:
        for k in self._keep:   # schedulers give graphs with nodes here back before they go
            forget = getattr(k, "_forget", None)
            if forget is not None and not k.closed:
                forget()
        self._keep = []
        super().close()        # closes the chunks and buffers (children) first
        self._buffers = []

    def __repr__(self):
        return "<Context closed>" if self.closed else f"<Context chunks={1 + len(self._extra)}>"


def contexts_of(raw_tensors) -> set:
    """The open Contexts whose memory holds these raw tensors (a graph's nodes can live in
    several: an op's result goes to its first operand's context)."""
    from ._handle import LIVE
    spans = []
    for c in list(LIVE):
        if isinstance(c, Context) and not c.closed and c._chunk_of is None:
            owner = c
            for raw in c._raws():
                base = int(ffi.cast("uintptr_t", lib.ggml_get_mem_buffer(raw)))
                spans.append((base, base + int(lib.ggml_get_mem_size(raw)), owner))
    found = set()
    for t in raw_tensors:
        a = int(ffi.cast("uintptr_t", t))
        for lo, hi, owner in spans:
            if lo <= a < hi:
                found.add(owner)
                break
    return found


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise InvalidArgument(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    require(1 <= len(shape) <= MAX_DIMS, f"tensors have 1 to {MAX_DIMS} axes, got {len(shape)}")
    require(all(s > 0 for s in shape), f"every axis must be >= 1, got {shape}")
    return shape


class Tensor:
    """A ggml tensor. Keeps its context (and so its memory) alive.

    ``shape`` is numpy order; ``ne``/``nb`` are ggml's order (fastest axis first).
    Arithmetic operators follow numpy's semantics (broadcasting, ``@`` is numpy's matmul);
    ggml's own ops are functions of the ``ggml_py`` module (``gg.mul_mat``...).
    """

    __slots__ = ("_p", "ctx", "_ndim", "_ne", "_type", "__weakref__")
    __array_priority__ = 1000  # numpy defers to our operators

    def __init__(self, p, ctx: Context, ndim: int | None = None):
        self._p = p
        self.ctx = ctx
        self._ndim = ndim
        self._ne = self._type = None     # fixed once ggml made the tensor: read once

    @property
    def ptr(self):
        self.ctx.ptr  # raises ClosedError once the context is closed
        return self._p

    # -- metadata ---------------------------------------------------------------------------
    @property
    def type(self) -> T.GGMLType:
        if self._type is None:
            self._type = T.of(int(self.ptr.type))
        return self._type

    @property
    def dtype(self) -> np.dtype | None:
        return self.type.numpy_dtype

    @property
    def ne(self) -> tuple[int, ...]:
        if self._ne is None:
            self._ne = tuple(self.ptr.ne)
        return self._ne

    @property
    def nb(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.ptr.nb)

    @property
    def ndim(self) -> int:
        if not self._ndim:
            self._ndim = int(lib.ggml_n_dims(self.ptr))
        return self._ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne[: self.ndim]))

    @property
    def size(self) -> int:
        return int(lib.ggml_nelements(self.ptr))

    @property
    def nbytes(self) -> int:
        return int(lib.ggml_nbytes(self.ptr))

    @property
    def name(self) -> str:
        return cstr(lib.ggml_get_name(self.ptr))

    @name.setter
    def name(self, value: str) -> None:
        raw = str(value).encode()
        require(len(raw) < int(lib.GGML_MAX_NAME), f"names are shorter than {int(lib.GGML_MAX_NAME)} bytes")
        lib.ggml_set_name(self.ptr, raw)

    @property
    def op(self) -> str:
        return cstr(lib.ggml_op_desc(self.ptr))

    @property
    def src(self) -> list["Tensor"]:
        out = []
        for s in self.ptr.src:
            if s != ffi.NULL:
                out.append(Tensor(s, self.ctx))
        return out

    @property
    def is_contiguous(self) -> bool:
        return bool(lib.ggml_is_contiguous(self.ptr))

    @property
    def data(self) -> int | None:
        """Address of the tensor's memory, None while unallocated."""
        d = self.ptr.data
        return None if d == ffi.NULL else int(ffi.cast("uintptr_t", d))

    @property
    def _view_src(self):
        v = self.ptr.view_src
        return None if v == ffi.NULL else v

    @property
    def buffer(self) -> Buffer | None:
        """A borrowed view of the buffer holding the tensor (None while unallocated)."""
        b = self.ptr.buffer
        return None if b == ffi.NULL else _BorrowedBuffer(b)

    @property
    def is_host(self) -> bool:
        b = self.ptr.buffer
        return b != ffi.NULL and bool(lib.ggml_backend_buffer_is_host(b))

    def _require_data(self, what: str) -> None:
        p = self.ptr
        if p.buffer == ffi.NULL or p.data == ffi.NULL:
            raise InvalidArgument(f"{what}: tensor {self.name or '(unnamed)'} has no memory; "
                                  "allocate it first (ctx.alloc(backend)) or compute its graph")
        ensure_alive(buffer_device(p.buffer))

    # -- data in and out --------------------------------------------------------------------
    def set(self, array, offset: int = 0) -> None:
        """Copy `array` into the tensor (blocking). The array must match the tensor's dtype and
        element count (or byte count for raw uint8 data at an offset)."""
        from .transfer import blocking_set
        blocking_set(self, array, offset)

    def numpy(self, *, copy: bool | None = None) -> np.ndarray:
        """The tensor's values as a numpy array.

        Host tensors of plain types are returned as a zero-copy view (pass ``copy=True`` for a
        copy); others are copied from the device, quantized types dequantized to float32."""
        from .transfer import to_numpy
        return to_numpy(self, copy)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy(copy=True)
        return a if dtype is None else a.astype(dtype)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export without a copy: host memory as CPU, CUDA buffers as CUDA memory
        (see :mod:`ggml_py.dlpack`)."""
        from . import dlpack
        if copy:
            raise BufferError("ggml tensors are exported without a copy; use t.numpy() to copy")
        if dl_device is not None and tuple(dl_device) != dlpack.device(self):
            raise BufferError(f"the tensor lives on DLPack device {dlpack.device(self)}, "
                              f"not {tuple(dl_device)}")
        return dlpack.capsule(self, max_version)

    def __dlpack_device__(self):
        from . import dlpack
        return dlpack.device(self)

    # -- numpy-like API: defined in ops.py -----------------------------------------------
    def __repr__(self):
        try:
            return f"<Tensor {self.name or ''} {self.type.name}{list(self.shape)} op={self.op}>"
        except ClosedError:
            return "<Tensor (context closed)>"

    def __eq__(self, other):  # identity of the underlying ggml tensor
        return isinstance(other, Tensor) and self._p == other._p

    def __hash__(self):
        return hash(int(ffi.cast("uintptr_t", self._p)))


class _BorrowedBuffer(Buffer):
    """A buffer seen through a tensor: never freed from here."""

    def __init__(self, raw):
        Owned.__init__(self, raw, lambda _: None)
        self._keep, self._dev = None, None
