"""Tensors: ggml tensors with numpy semantics for Python's operators.

``shape`` is numpy order (slowest axis first); ``ne``/``nb`` are ggml's order. Operators follow
numpy: broadcasting, Python scalars on either side, ``@`` is numpy's matmul, any layout (a
strided view is copied where a kernel needs packed rows). ggml's own ops, with ggml's
semantics, are the functions of :mod:`ggml_py.ops` (``gg.add``, ``gg.mul_mat``...).

    >>> ctx = gg.Context()                         # doctest: +SKIP
    >>> a = ctx.tensor(gg.f32, (2, 3)); ctx.alloc(gg.device("CPU").backend())
    >>> a.set(np.ones((2, 3), np.float32)); a.numpy()
"""
from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, cast

import numpy as np

from . import _transfer
from . import ops
from ._loader import ffi, lib
from ._rewire import own_sources
from ._tensor_base import TensorBase
from .ops._common import scalable
from .ops.elementwise import binary_op
from .errors import ClosedError, InvalidType, require

Scalar = int | float | np.integer | np.floating


def _is_scalar(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _constant(t: "Tensor", x: Any) -> "Tensor | None":
    """The array-like `x` (an ndarray, a list, anything numpy turns into an array; not a
    number, not a tensor) as a constant leaf of `t`'s context, converted to `t`'s dtype
    (numpy's same_kind casting, else InvalidType); None when `x` is no array-like. Its
    values are set when the context is allocated (at once when it has memory already)."""
    if isinstance(x, (TensorBase, str, bytes)) or not (
            isinstance(x, (np.ndarray, list, tuple)) or hasattr(x, "__array__")
            or hasattr(x, "__array_interface__")):
        return None
    a = np.asarray(x)
    dt = t.dtype
    if dt is None:
        raise InvalidType(f"{t.type.name} tensor with an array: arrays mix with plain-typed "
                          "tensors only (f32, f16, i32...)")
    if a.dtype.hasobject or not np.can_cast(a.dtype, dt, "same_kind"):
        raise InvalidType(f"an array of {a.dtype} cannot become a {t.type.name} constant "
                          f"(numpy's same_kind casting); convert it first")
    c: Tensor = t.ctx.constant(a.astype(dt, copy=False).reshape(a.shape or (1,)))
    return c


def _mixed(name: str, a: Any, b: Any, reflected: bool = False) -> "Tensor":
    """a <op> b where one side is a tensor and the other an array-like (see _constant);
    NotImplemented (for Python to try the other side) when it is neither."""
    t, x = (b, a) if reflected else (a, b)
    c = _constant(t, x)
    if c is None:
        return cast("Tensor", NotImplemented)
    op = getattr(Tensor, name)
    result: Tensor = op(c, t) if reflected else op(t, c)
    return result


def _divide_by(t: "Tensor", c: float) -> "Tensor":
    """t / c for a Python number c (ggml's scale by 1 / c; infinities of c's sign for 0)."""
    return ops.scale(_padded(t), 1.0 / c if c else math.copysign(math.inf, c))


def _padded(t: "Tensor") -> "Tensor":
    """`t`, or a contiguous copy (ggml's CPU scale kernel needs contiguous input)."""
    return t if scalable(t) else ops.cont(t)


class Tensor(TensorBase):
    """A ggml tensor. Keeps the context that owns it (and so its memory) alive.

    ``shape`` is numpy order; ``ne``/``nb`` are ggml's order (fastest axis first).
    Arithmetic operators follow numpy's semantics (broadcasting, ``@`` is numpy's matmul);
    ggml's own ops are functions of the ``ggml_py`` module (``gg.mul_mat``...).
    """

    __slots__ = ()
    # numpy never takes an operation over: ndarray <op> Tensor returns NotImplemented, so
    # Python asks the tensor's reflected operator (see docs/numpy-mixing.md)
    __array_ufunc__ = None
    __array_priority__ = 1000

    # -- graph structure ---------------------------------------------------------------------
    @property
    def src(self) -> list["Tensor"]:
        """The operands of this tensor's op, each kept by the context that owns it."""
        out = []
        for s in own_sources(self.ptr, (self.ctx,)):     # not a scheduler's copies
            if s != ffi.NULL:
                out.append(self.ctx.wrap_raw(s))
        return out

    def set_input(self) -> None:
        """Mark the tensor as a graph input (``ggml_set_input``): a scheduler then allocates
        it when it has no memory, the way llama.cpp feeds its inputs. Leaves only (ggml's
        rule: a view or an op result is computed, not fed)."""
        p = self.ptr
        require(int(p.op) == int(lib.GGML_OP_NONE),
                f"set_input: {self.name or '(unnamed)'} is the result of op {self.op}, not a "
                "leaf; mark the tensor it is computed from, or feed a new tensor")
        lib.ggml_set_input(p)

    # -- data in and out --------------------------------------------------------------------
    def set(self, array: Any, offset: int = 0, *, flat: bool = False) -> None:
        """Copy `array` into the tensor (blocking). The array has the tensor's dtype and shape
        (numpy order; float32 values of a quantized tensor's shape are quantized). `flat=True`
        writes a run in memory order instead: the array's elements, of the tensor's dtype, or
        raw uint8 bytes, at byte `offset`."""
        _transfer.blocking_set(self, array, offset, flat)

    def numpy(self, *, copy: bool | None = None) -> np.ndarray:
        """The tensor's values as a numpy array.

        Host tensors of plain types are returned as a zero-copy view that keeps the tensor's
        context alive (pass ``copy=True`` for a copy); others are copied from the device,
        quantized types dequantized to float32."""
        require(copy is None or isinstance(copy, bool), "numpy: copy must be None or a bool",
                InvalidType)
        return _transfer.to_numpy(self, copy)

    def raw_numpy(self) -> np.ndarray:
        """A copy of the tensor's memory as it is, written or not: the one read that does not
        raise :class:`~ggml_py.errors.UnwrittenError` for values no one set, loaded, copied or
        computed (``numpy()`` does)."""
        return _transfer.to_numpy(self, True, raw=True)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = self.numpy(copy=True)
        return a if dtype is None else a.astype(dtype)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        """DLPack export without a copy: host memory as CPU, CUDA buffers as CUDA memory
        (see :mod:`ggml_py.dlpack`)."""
        from . import dlpack
        if copy:
            raise BufferError("ggml tensors are exported without a copy; use t.numpy() to copy")
        if dl_device is not None and tuple(dl_device) != dlpack.device(self):
            raise BufferError(f"the tensor lives on DLPack device {dlpack.device(self)}, "
                              f"not {tuple(dl_device)}")
        return dlpack.capsule(self, max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        from . import dlpack
        return dlpack.device(self)

    # -- numpy-like views -------------------------------------------------------------------
    def reshape(self, *shape: Any) -> "Tensor":
        """numpy's ``a.reshape(shape)`` as a view (a strided tensor is copied first)."""
        dims = shape[0] if len(shape) == 1 and not _is_scalar(shape[0]) else shape
        return ops.reshape(self if self.is_contiguous else ops.cont(self), dims)

    def permute(self, axes: Any) -> "Tensor":
        """numpy's ``np.transpose(a, axes)`` as a view."""
        return ops.permute(self, axes)

    @property
    def T(self) -> "Tensor":
        """The axes reversed (numpy's ``a.T``), a view."""
        return ops.permute(self, tuple(reversed(range(self.ndim))))

    def view(self, shape: Any, offset: int = 0, strides: Any = None) -> "Tensor":
        """A view of this tensor's memory (see :func:`ggml_py.view`)."""
        return ops.view(self, shape, offset, strides)

    # -- numpy-semantics operators -------------------------------------------------------------
    # + - * / of two tensors: numpy's semantics, the common case in one checked call
    # (ops.elementwise.binary_op); a Python number on the right goes to ggml's scale
    __add__: ClassVar[Callable[["Tensor", "Tensor | Scalar"], "Tensor"]] = binary_op(
        "add", True, "a + b (numpy's broadcasting; b a tensor, a number or an array)",
        lambda a, b: ops.scale_bias(_padded(a), 1.0, float(b)) if _is_scalar(b)
        else _mixed("__add__", a, b))
    __sub__: ClassVar[Callable[["Tensor", "Tensor | Scalar"], "Tensor"]] = binary_op(
        "sub", True, "a - b (numpy's broadcasting; b a tensor, a number or an array)",
        lambda a, b: ops.scale_bias(_padded(a), 1.0, -float(b)) if _is_scalar(b)
        else _mixed("__sub__", a, b))
    __mul__: ClassVar[Callable[["Tensor", "Tensor | Scalar"], "Tensor"]] = binary_op(
        "mul", True, "a * b (numpy's broadcasting; b a tensor, a number or an array)",
        lambda a, b: ops.scale(_padded(a), float(b)) if _is_scalar(b)
        else _mixed("__mul__", a, b))
    __truediv__: ClassVar[Callable[["Tensor", "Tensor | Scalar"], "Tensor"]] = binary_op(
        "div", True, "a / b (numpy's broadcasting; b a tensor, a number or an array)",
        lambda a, b: _divide_by(a, float(b)) if _is_scalar(b)
        else _mixed("__truediv__", a, b))

    def __radd__(self, other: Any) -> "Tensor":
        if _is_scalar(other):
            return ops.scale_bias(_padded(self), 1.0, float(other))
        return _mixed("__add__", other, self, True)

    def __rsub__(self, other: Any) -> "Tensor":
        if _is_scalar(other):
            return ops.scale_bias(_padded(self), -1.0, float(other))
        return _mixed("__sub__", other, self, True)

    def __rmul__(self, other: Any) -> "Tensor":
        if _is_scalar(other):
            return ops.scale(_padded(self), float(other))
        return _mixed("__mul__", other, self, True)

    def __rtruediv__(self, other: Any) -> "Tensor":
        if _is_scalar(other):
            a = self if self.is_contiguous else ops.cont(self)
            return ops.div(ops.fill(a, float(other)), a)
        return _mixed("__truediv__", other, self, True)

    def __matmul__(self, other: Any) -> "Tensor":
        """numpy's ``a @ b``; `b` a tensor or an array-like (a constant leaf)."""
        if not isinstance(other, Tensor):
            return _mixed("__matmul__", self, other)
        return ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> "Tensor":
        if not isinstance(other, Tensor):
            return _mixed("__matmul__", other, self, True)
        return ops.matmul(other, self)

    def __neg__(self) -> "Tensor":
        return ops.elementwise.neg(_padded(self))

    def __pos__(self) -> "Tensor":
        return self

    def __abs__(self) -> "Tensor":
        return ops.elementwise.abs(_padded(self))

    # -- identity and display -----------------------------------------------------------------
    def __repr__(self) -> str:
        try:
            return f"<Tensor {self.name or ''} {self.type.name}{list(self.shape)} op={self.op}>"
        except ClosedError:
            return "<Tensor (context closed)>"

    def _repr_html_(self) -> str:
        try:
            from ._display import tensor_html
        except ImportError:
            return f"<pre>{self!r}</pre>"
        return str(tensor_html(self))

    def __eq__(self, other: object) -> bool:  # identity of the underlying ggml tensor
        return isinstance(other, Tensor) and bool(self._p == other._p)

    def __hash__(self) -> int:
        return hash(int(ffi.cast("uintptr_t", self._p)))

    def __bool__(self) -> bool:
        return True


__all__ = ["Tensor"]
