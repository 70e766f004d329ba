"""What every tensor knows about itself: the facts ops validate against, read from ggml once.

:class:`TensorBase` is the part of :class:`~ggml_py.Tensor` the op builders (``ggml_py.ops``)
need: shape, type, strides, contiguity, memory. The ops package sits between this module and
``_tensor.py``, where :class:`~ggml_py.Tensor` adds numpy semantics and operators built from
the ops. A tensor's facts are fixed once ggml made it (shape, type, strides), so each is read
from C on first use and cached.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import _types
from ._buffer import Buffer, BorrowedBuffer, host_addressable
from ._device import BufferType
from ._interfaces import TensorHome, TensorLike
from ._rpc_liveness import buffer_device, check_access
from ._loader import cstr, ffi, lib
from .errors import ClosedError, InvalidArgument, InvalidType, OutOfMemory, require


MAX_DIMS = int(lib.GGML_MAX_DIMS)
MAX_NAME = int(lib.GGML_MAX_NAME)
_INT64_MAX = 2 ** 63 - 1


def shape_of(shape: Any, what: str = "shape") -> tuple[int, ...]:
    """A numpy-order shape of 1..4 positive ints (``operator.index``: no floats, no strings)."""
    if isinstance(shape, (str, bytes)):
        raise InvalidType(f"{what} must be an int or a sequence of ints, not {shape!r}")
    if hasattr(shape, "__iter__"):
        dims: tuple[int, ...] = tuple(index_of(s, what) for s in shape)
    else:
        dims = (index_of(shape, what),)
    require(1 <= len(dims) <= MAX_DIMS, f"{what}: tensors have 1 to {MAX_DIMS} axes, got {len(dims)}")
    require(all(s > 0 for s in dims), f"{what}: every axis must be >= 1, got {dims}")
    n = 1
    for s in dims:
        n *= s
    require(n <= _INT64_MAX // 8, f"{what}: {dims} has more elements than ggml can address",
            OutOfMemory)
    return dims


def index_of(value: Any, what: str) -> int:
    """An integer argument (``operator.index``): floats and strings are refused."""
    if isinstance(value, bool):
        raise InvalidType(f"{what} must be an int, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidType(f"{what} must be an int, not {type(value).__name__}") from None


def float_of(value: Any, what: str) -> float:
    """A finite-or-not float argument (Python or numpy scalar, not a string or a tensor)."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidType(f"{what} must be a number, not {type(value).__name__}")
    return float(value)


class TensorBase(TensorLike):
    """A ggml tensor's facts; keeps the context that owns the tensor (and so its memory)
    alive.

    The class deriving from it directly (:class:`~ggml_py.Tensor`) is the one the checked ops
    build their results as: an op whose operands are all of that class calls ``cls(p, ctx,
    ndim)`` with the operands' own class (see ``ops._common.CHECKED_OPS``)."""

    __slots__ = ("_p", "ctx", "_ndim", "_ne", "_nb", "_type", "_contig", "_shape", "_whole",
                 "__weakref__")

    def __init__(self, p: Any, ctx: TensorHome, ndim: int | None = None,
                 type: _types.GGMLType | None = None, ne: tuple[int, ...] | None = None,
                 nb: tuple[int, ...] | None = None, shape: tuple[int, ...] | None = None,
                 contig: bool | None = None) -> None:
        # facts a builder already knows are given (they equal what ggml holds); the others
        # are read from ggml on first use
        self._p = p
        self.ctx = ctx
        # an int from the start (the binary ops compare operands' without a call)
        if not ndim:
            if not p:
                raise InvalidArgument("a Tensor needs a ggml_tensor, not NULL")
            ndim = int(lib.ggml_n_dims(p))
        self._ndim = ndim
        self._type = type
        self._ne = ne
        self._nb = nb
        self._shape = shape
        self._contig = contig
        self._whole: tuple[Any, int] | tuple[()] | None = None    # see whole_transfer

    @property
    def ptr(self) -> Any:
        """The raw ``struct ggml_tensor *``; ClosedError once its context is closed."""
        if self.ctx._raw is None:
            raise ClosedError("this tensor's context is closed")
        return self._p

    # -- facts ------------------------------------------------------------------------------
    @property
    def type(self) -> _types.GGMLType:
        if self._type is None:
            self._type = _types.of(int(self.ptr.type))
        return self._type

    @property
    def dtype(self) -> "np.dtype[Any] | None":
        return self.type.numpy_dtype

    @property
    def ne(self) -> tuple[int, ...]:
        """ggml's shape: elements per dimension, fastest first (always 4 entries)."""
        if self.ctx._raw is None:
            raise ClosedError("this tensor's context is closed")
        if self._ne is None:
            self._ne = tuple(int(x) for x in self.ptr.ne)
        return self._ne

    @property
    def nb(self) -> tuple[int, ...]:
        """ggml's strides in bytes, fastest dimension first."""
        if self._nb is None:
            self._nb = tuple(int(x) for x in self.ptr.nb)
        return self._nb

    @property
    def ndim(self) -> int:
        if not self._ndim:
            self._ndim = int(lib.ggml_n_dims(self.ptr))
        return self._ndim

    @property
    def shape(self) -> tuple[int, ...]:
        if self.ctx._raw is None:
            raise ClosedError("this tensor's context is closed")
        shape = self._shape
        if shape is None:            # fixed once ggml made the tensor
            shape = self._shape = tuple(reversed(self.ne[: self.ndim]))
        return shape

    @property
    def size(self) -> int:
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    @property
    def nbytes(self) -> int:
        return int(lib.ggml_nbytes(self.ptr))

    def whole_transfer(self) -> "tuple[Any, int] | None":
        """(numpy dtype, element count) when the tensor is contiguous and of a plain type, so
        that an array of that dtype and count, C-contiguous, copies in or out whole (its bytes
        are the tensor's); None otherwise. Fixed once ggml made the tensor: asked once."""
        w = self._whole
        if w is None:
            dt = self.type.numpy_dtype
            w = self._whole = (dt, self.size) if dt is not None and self.is_contiguous else ()
        return w if len(w) == 2 else None

    @property
    def name(self) -> str:
        return cstr(lib.ggml_get_name(self.ptr)) or ""

    @name.setter
    def name(self, value: str) -> None:
        require(isinstance(value, str), f"name must be a str, not {type(value).__name__}",
                InvalidType)
        raw = value.encode()
        require(b"\0" not in raw, "name must not contain NUL characters")
        require(len(raw) < MAX_NAME, f"name: names are shorter than {MAX_NAME} bytes, "
                                     f"{value!r} has {len(raw)}")
        lib.ggml_set_name(self.ptr, raw)

    @property
    def op(self) -> str:
        return cstr(lib.ggml_op_desc(self.ptr)) or ""

    @property
    def is_contiguous(self) -> bool:
        if self._contig is None:           # fixed by shape and strides: asked once
            self._contig = bool(lib.ggml_is_contiguous(self.ptr))
        elif self.ctx._raw is None:
            raise ClosedError("this tensor's context is closed")
        return self._contig

    @property
    def is_transposed(self) -> bool:
        return bool(lib.ggml_is_transposed(self.ptr))

    @property
    def data(self) -> int | None:
        """Address of the tensor's memory, None while unallocated."""
        d = self.ptr.data
        return None if d == ffi.NULL else int(ffi.cast("uintptr_t", d))

    @property
    def buffer(self) -> Buffer | None:
        """A borrowed view of the buffer holding the tensor (None while unallocated)."""
        b = self.ptr.buffer
        if b == ffi.NULL:
            return None
        return BorrowedBuffer(b, BufferType(lib.ggml_backend_buffer_get_type(b)), self)

    @property
    def is_host(self) -> bool:
        """Whether the tensor's memory is at its ``data`` address in this process (host
        memory; not a meta device's, whose addresses are placeholders)."""
        return host_addressable(self.ptr.buffer)

    @property
    def is_allocated(self) -> bool:
        p = self.ptr
        return bool(p.buffer != ffi.NULL and p.data != ffi.NULL)

    def require_memory(self, what: str) -> Any:
        """The raw tensor, once it is sure to have live memory: InvalidArgument while
        unallocated, ClosedError once its context closed, RPCError once its server died."""
        p = self.ptr
        if p.buffer == ffi.NULL or p.data == ffi.NULL:
            raise InvalidArgument(f"{what}: tensor {self.name or '(unnamed)'} has no memory; "
                                  "allocate it first (ctx.alloc(backend)) or compute its graph")
        check_access(buffer_device(p.buffer), p, what)
        return p

    def __copy__(self) -> Any:
        raise TypeError("a Tensor is a handle into its context and cannot be copied; "
                        "use gg.cont(t) for a copy in the graph, or t.numpy()")

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError("a Tensor is a handle into its context and cannot be copied; "
                        "use t.numpy() for the values")

    def __reduce__(self) -> Any:
        raise TypeError("a Tensor cannot be pickled; pickle t.numpy() instead")
