"""ggml ops as Python functions, each validated by ggml's own rules before it reaches C.

Functions named after ggml's ops (``gg.add``, ``gg.mul_mat``...) have ggml's semantics: shapes
are ggml's ``ne``, broadcasting is ggml's "repeat" (the second operand tiles into the first).
Tensor operators (``a + b``, ``a @ b``) have numpy's semantics and are built from these.
Results live in the first operand's context.
"""
from __future__ import annotations

import builtins

import numpy as np

from . import types as T
from ._loader import ffi, lib
from .errors import InvalidArgument, InvalidType, require
from .tensor import MAX_DIMS, Tensor

FLOAT = ("f32", "f16", "bf16")


def _t(x, what="operand") -> Tensor:
    require(isinstance(x, Tensor), f"{what} must be a Tensor, not {type(x).__name__}", InvalidType)
    x.ptr  # closed context -> ClosedError
    return x


def _float(*ts) -> None:
    for t in ts:
        require(t.type.name in FLOAT, f"this op needs float tensors (f32/f16/bf16), got {t.type.name}",
                InvalidType)


def _out(p, like: Tensor, ndim: int | None = None) -> Tensor:
    return Tensor(p, like.ctx, ndim=ndim)


def _ctx(t: Tensor, n: int = 4):
    return t.ctx._room(n)


def _can_repeat(small: Tensor, big: Tensor) -> bool:
    return all(b % s == 0 for s, b in zip(small.ne, big.ne))


# -- elementwise binary ---------------------------------------------------------------------
def _binary(fn, a, b, name):
    a, b = _t(a), _t(b)
    _float(a, b)
    require(_can_repeat(b, a), f"{name}: shape {b.shape} does not repeat into {a.shape} "
                               "(each ggml dim of b must divide a's)")
    require(a.type == b.type or b.type.name == "f32",
            f"{name}: mixed types {a.type.name} and {b.type.name}", InvalidType)
    return _out(fn(_ctx(a), a.ptr, b.ptr), a, max(a.ndim, b.ndim))


def add(a, b): return _binary(lib.ggml_add, a, b, "add")
def sub(a, b): return _binary(lib.ggml_sub, a, b, "sub")
def mul(a, b): return _binary(lib.ggml_mul, a, b, "mul")
def div(a, b): return _binary(lib.ggml_div, a, b, "div")


def scale(a, s: float):
    a = _t(a)
    _float(a)
    return _out(lib.ggml_scale(_ctx(a), a.ptr, float(s)), a)


# -- unary ----------------------------------------------------------------------------------
def _unary(fn, name):
    def op(a):
        a = _t(a)
        _float(a)
        return _out(fn(_ctx(a), a.ptr), a)
    op.__name__ = name
    op.__doc__ = f"ggml_{name}(a), elementwise."
    return op


_UNARY = ("relu", "gelu", "silu", "tanh", "exp", "sqr", "sqrt", "log", "abs", "neg", "sigmoid",
          "sin", "cos", "step", "elu", "gelu_quick", "hardswish", "hardsigmoid", "sgn")
for _n in _UNARY:
    if hasattr(lib, f"ggml_{_n}"):
        globals()[_n] = _unary(getattr(lib, f"ggml_{_n}"), _n)


# -- reductions -----------------------------------------------------------------------------
def sum(a):
    """Sum of all elements (a 1-element tensor)."""
    a = _t(a)
    _float(a)
    return _out(lib.ggml_sum(_ctx(a), a.ptr), a, 1)


def sum_rows(a):
    a = _t(a)
    _float(a)
    return _out(lib.ggml_sum_rows(_ctx(a), a.ptr), a)


def mean(a):
    """Mean of each row (ggml_mean)."""
    a = _t(a)
    _float(a)
    return _out(lib.ggml_mean(_ctx(a), a.ptr), a)


def argmax(a):
    """Index of the largest value of each row of a matrix (i32)."""
    a = _t(a)
    require(a.type.name == "f32", "argmax takes f32", InvalidType)
    require(a.ne[2] == 1 and a.ne[3] == 1, f"argmax takes a matrix, got {a.shape}")
    return _out(lib.ggml_argmax(_ctx(a), a.ptr), a, 1)


# -- matrix products ------------------------------------------------------------------------
def mul_mat(a, b):
    """ggml_mul_mat: result ne = [a.ne1, b.ne1, b.ne2, b.ne3] (numpy: b @ a.T), f32."""
    a, b = _t(a), _t(b)
    require(a.ne[0] == b.ne[0], f"mul_mat: inner dims differ (a.ne0={a.ne[0]}, b.ne0={b.ne[0]})")
    require(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0,
            f"mul_mat: b's batch dims {b.ne[2:]} must be multiples of a's {a.ne[2:]}")
    require(not lib.ggml_is_transposed(a.ptr), "mul_mat: a must not be transposed; use gg.cont(a)")
    require(b.type.name in FLOAT, f"mul_mat: b must be a float tensor, got {b.type.name}", InvalidType)
    return _out(lib.ggml_mul_mat(_ctx(a), a.ptr, b.ptr), b, max(a.ndim, b.ndim, 2))


def out_prod(a, b):
    """ggml_out_prod: result ne = [a.ne0, b.ne0, b.ne2, b.ne3]."""
    a, b = _t(a), _t(b)
    require(a.ne[1] == b.ne[1], f"out_prod: a.ne1={a.ne[1]} != b.ne1={b.ne[1]}")
    require(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0,
            "out_prod: b's batch dims must be multiples of a's")
    return _out(lib.ggml_out_prod(_ctx(a), a.ptr, b.ptr), a, max(a.ndim, b.ndim, 2))


def matmul(a, b):
    """numpy's ``a @ b`` (last two axes, batch axes broadcast)."""
    a, b = _t(a), _t(b)
    require(a.ndim >= 1 and b.ndim >= 1, "matmul needs at least 1-D operands")
    a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    sa, sb = a2.shape, b2.shape
    require(sa[-1] == sb[-2], f"matmul: shapes {a.shape} and {b.shape} are not aligned "
                              f"({sa[-1]} != {sb[-2]})")
    batch_a, batch_b = sa[:-2], sb[:-2]
    try:
        batch = np.broadcast_shapes(batch_a, batch_b)
    except ValueError:
        raise InvalidArgument(f"matmul: batch shapes {batch_a} and {batch_b} do not broadcast") from None
    require(len(batch) <= 2, "matmul supports up to 2 batch axes")
    bt = cont(transpose(b2))                     # ne [K, N, ...]: rows of B^T
    full = batch + sa[-2:]
    if _prod(batch_a) != _prod(batch) or len(batch_a) != len(batch):
        a2 = repeat(a2, full) if a2.shape != full else a2
    out = mul_mat(bt, a2)                        # ne [N, M, batch...] = (..., M, N)
    shape = batch + (sa[-2], sb[-1])
    out._ndim = len(shape)
    if a.ndim == 1 or b.ndim == 1:
        keep = [d for d, drop in zip(shape, [False] * len(batch) + [a.ndim == 1, b.ndim == 1]) if not drop]
        return reshape(out, tuple(keep) or (1,))
    return out


def _prod(s) -> int:
    r = 1
    for x in s:
        r *= x
    return r


# -- shape ops --------------------------------------------------------------------------------
def reshape(a, shape):
    """A view of contiguous `a` with another numpy-order shape (same element count)."""
    a = _t(a)
    shape = tuple(int(s) for s in ((shape,) if isinstance(shape, int) else shape))
    if -1 in shape:
        known = _prod(s for s in shape if s != -1)
        require(shape.count(-1) == 1 and known > 0 and a.size % known == 0,
                f"cannot reshape {a.shape} into {shape}")
        shape = tuple(a.size // known if s == -1 else s for s in shape)
    require(1 <= len(shape) <= MAX_DIMS and all(s > 0 for s in shape), f"bad shape {shape}")
    require(_prod(shape) == a.size, f"cannot reshape {a.shape} ({a.size} elements) into {shape}")
    require(a.is_contiguous, "reshape needs a contiguous tensor; use gg.cont(t) first")
    ne = list(reversed(shape)) + [1] * (4 - len(shape))
    require(ne[0] % a.type.block_size == 0, "reshape would split quantized blocks")
    p = lib.ggml_reshape_4d(_ctx(a), a.ptr, *ne)
    return _out(p, a, len(shape))


def view(a, shape, offset: int = 0, strides=None):
    """A view of `a`'s memory: numpy-order `shape`, byte `offset`, numpy-order byte `strides`."""
    a = _t(a)
    shape = tuple(int(s) for s in shape)
    require(1 <= len(shape) <= MAX_DIMS and all(s > 0 for s in shape), f"bad view shape {shape}")
    ne = list(reversed(shape)) + [1] * (4 - len(shape))
    ts = a.type.type_size // a.type.block_size if a.type.block_size == 1 else None
    require(ts is not None, "views of quantized tensors are not supported here")
    if strides is None:
        nb = [ts]
        for i in range(1, 4):
            nb.append(nb[-1] * ne[i - 1])
    else:
        nb = [ts] + [int(s) for s in reversed(tuple(strides)[:-1])]
        require(int(tuple(strides)[-1]) == ts, "the last stride must be the element size")
        nb += [nb[-1] * ne[len(nb) - 1]] * (4 - len(nb))
    last = offset + builtins.sum((n - 1) * s for n, s in zip(ne, nb)) + ts
    require(offset >= 0 and last <= a.nbytes,
            f"view of {shape} at offset {offset} runs past the tensor's {a.nbytes} bytes")
    p = lib.ggml_view_4d(_ctx(a), a.ptr, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], int(offset))
    return _out(p, a, len(shape))


def permute(a, axes):
    """numpy's ``np.transpose(a, axes)`` as a view."""
    a = _t(a)
    n = a.ndim
    axes = tuple(int(x) for x in axes)
    require(sorted(axes) == list(range(n)), f"axes {axes} are not a permutation of {n} axes")
    # numpy axis i -> ggml dim n-1-i ; result numpy axis j takes input axis axes[j]
    gperm = [0, 1, 2, 3]
    for j, src_axis in enumerate(axes):
        gperm[n - 1 - src_axis] = n - 1 - j
    return _out(lib.ggml_permute(_ctx(a), a.ptr, *gperm), a, n)


def transpose(a):
    """Swap the last two numpy axes (ggml_transpose: ne0 <-> ne1), a view."""
    a = _t(a)
    return _out(lib.ggml_transpose(_ctx(a), a.ptr), a, max(a.ndim, 2))


def cont(a):
    """A contiguous copy of `a`."""
    a = _t(a)
    return _out(lib.ggml_cont(_ctx(a), a.ptr), a)


def cpy(a, b):
    """Copy `a` into `b` (same element count; converts types ggml can convert)."""
    a, b = _t(a), _t(b)
    require(a.size == b.size, f"cpy: {a.size} elements into {b.size}")
    return _out(lib.ggml_cpy(_ctx(a), a.ptr, b.ptr), b)


def repeat(a, shape):
    """Tile `a` to numpy-order `shape` (each axis a multiple of a's)."""
    a = _t(a)
    shape = tuple(int(s) for s in shape)
    ne = list(reversed(shape)) + [1] * (4 - len(shape))
    require(all(n % m == 0 for m, n in zip(a.ne, ne)), f"repeat: {a.shape} does not tile into {shape}")
    p = lib.ggml_repeat_4d(_ctx(a), a.ptr, *ne)
    return _out(p, a, len(shape))


def concat(a, b, axis: int = 0):
    """numpy's ``np.concatenate([a, b], axis)``."""
    a, b = _t(a), _t(b)
    n = max(a.ndim, b.ndim)
    axis = axis + n if axis < 0 else axis
    require(0 <= axis < n, f"concat: axis {axis} out of range for {n} axes")
    dim = n - 1 - axis
    require(a.type == b.type, f"concat: types differ ({a.type.name}, {b.type.name})", InvalidType)
    require(all(a.ne[i] == b.ne[i] for i in range(4) if i != dim),
            f"concat: shapes {a.shape} and {b.shape} differ off axis {axis}")
    return _out(lib.ggml_concat(_ctx(a), a.ptr, b.ptr, dim), a, n)


def get_rows(a, idx):
    """Rows of `a` picked by the i32 indices `idx` (embedding lookup)."""
    a, idx = _t(a), _t(idx, "indices")
    require(idx.type.name == "i32", f"get_rows: indices must be i32, got {idx.type.name}", InvalidType)
    require(a.ne[2] == idx.ne[1] and idx.ne[3] == 1 or (a.ne[2] == 1 and idx.ne[1] == 1),
            f"get_rows: index shape {idx.shape} does not fit {a.shape}")
    return _out(lib.ggml_get_rows(_ctx(a), a.ptr, idx.ptr), a, max(a.ndim, idx.ndim + 1))


# -- normalisation and attention ----------------------------------------------------------------
def soft_max(a, mask=None, scale: float = 1.0, max_bias: float = 0.0):
    """softmax over rows of `a` (the last numpy axis), with an optional additive mask."""
    a = _t(a)
    _float(a)
    if mask is None:
        if scale == 1.0 and max_bias == 0.0:
            return _out(lib.ggml_soft_max(_ctx(a), a.ptr), a)
        m = ffi.NULL
    else:
        mask = _t(mask, "mask")
        require(mask.type.name in ("f32", "f16"), "soft_max: mask must be f32 or f16", InvalidType)
        require(mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1],
                f"soft_max: mask {mask.shape} does not cover {a.shape}")
        require(a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0,
                "soft_max: mask batch dims must divide a's")
        m = mask.ptr
    return _out(lib.ggml_soft_max_ext(_ctx(a), a.ptr, m, float(scale), float(max_bias)), a)


def norm(a, eps: float = 1e-5):
    a = _t(a)
    _float(a)
    return _out(lib.ggml_norm(_ctx(a), a.ptr, float(eps)), a)


def rms_norm(a, eps: float = 1e-6):
    a = _t(a)
    _float(a)
    return _out(lib.ggml_rms_norm(_ctx(a), a.ptr, float(eps)), a)


# -- numpy semantics for Tensor operators ---------------------------------------------------------
def _broadcast(a, b, name):
    """(a', b') with numpy broadcasting made explicit where ggml's repeat rule needs it."""
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise InvalidArgument(f"{name}: shapes {a.shape} and {b.shape} do not broadcast") from None
    if a.shape != shape:
        a = repeat(a, shape)
    if b.shape != shape and not _can_repeat(b, a):
        b = repeat(b, shape)
    return a, b


def _np_binary(fn, name, swap=False):
    def op(self, other):
        if isinstance(other, (int, float)) and name in ("mul", "div"):
            return scale(self, other if name == "mul" else 1.0 / other)
        if not isinstance(other, Tensor):
            return NotImplemented
        a, b = (other, self) if swap else (self, other)
        a, b = _broadcast(a, b, name)
        return fn(a, b)
    return op


Tensor.__add__ = _np_binary(add, "add")
Tensor.__radd__ = _np_binary(add, "add", swap=True)
Tensor.__sub__ = _np_binary(sub, "sub")
Tensor.__mul__ = _np_binary(mul, "mul")
Tensor.__rmul__ = lambda self, other: scale(self, other) if isinstance(other, (int, float)) else NotImplemented
Tensor.__truediv__ = _np_binary(div, "div")
Tensor.__matmul__ = lambda self, other: matmul(self, other) if isinstance(other, Tensor) else NotImplemented
Tensor.__neg__ = lambda self: globals()["neg"](self)
Tensor.reshape = lambda self, *shape: reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)
Tensor.permute = lambda self, axes: permute(self, axes)
Tensor.T = property(lambda self: permute(self, tuple(reversed(range(self.ndim)))))
Tensor.view = lambda self, shape, offset=0, strides=None: view(self, shape, offset, strides)
