"""Convolution and pooling: im2col, conv_1d, conv_2d, pool_2d, validated by ggml_im2col's and
ggml_pool_2d's rules (positive strides and dilations, non-negative padding, an output of at
least one element, matching channels)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _types
from .._loader import lib
from ..errors import InvalidType, require
from ._common import Tensor, RELEASE, build, cpu_type, floats, index_of, rows, tensor



def _conv_size(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _pair(x: Any, what: str) -> tuple[int, int]:
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x), int(x)
    try:
        xs = tuple(x)
    except TypeError:
        raise InvalidType(f"{what} must be an int or a pair of ints, not {x!r}") from None
    require(len(xs) == 2, f"{what} must be an int or a pair of ints, not {x!r}", InvalidType)
    return index_of(xs[0], what), index_of(xs[1], what)


def _im2col_args(a: Tensor, b: Tensor, stride: Any, padding: Any, dilation: Any,
                 is_2d: bool) -> tuple[int, int, int, int, int, int]:
    """Validated (s0, s1, p0, p1, d0, d1) in ggml's order, by ggml_im2col's rules."""
    cpu_type(b, "im2col", "im2col data")
    rows("im2col", ("data", b))
    (s1, s0), (p1, p0), (d1, d0) = (_pair(stride, "stride"), _pair(padding, "padding"),
                                    _pair(dilation, "dilation"))
    require(s0 > 0 and s1 > 0 and d0 > 0 and d1 > 0 and p0 >= 0 and p1 >= 0,
            "strides and dilations must be positive, paddings non-negative")
    if is_2d:
        require(a.ne[2] == b.ne[2], f"kernel {a.shape} has {a.ne[2]} input channels, "
                                    f"data {b.shape} has {b.ne[2]}")
        oh = _conv_size(b.ne[1], a.ne[1], s1, p1, d1)
    else:
        require(a.ne[1] == b.ne[1] and b.ne[3] == 1,
                f"kernel {a.shape} and data {b.shape} differ in input channels")
        oh = 1
    ow = _conv_size(b.ne[0], a.ne[0], s0, p0, d0)
    require(ow > 0 and oh > 0, f"data {b.shape} is smaller than the kernel {a.shape}")
    return s0, s1, p0, p1, d0, d1


def _f16_columns(a: Tensor, op: str) -> None:
    """Before ggml 0.20.2 the CPU im2col kernel that writes f16 columns asserts an f16 kernel,
    and ggml_conv_1d always asks for f16 columns (0.20.2 takes the kernel's type)."""
    if RELEASE < (0, 20, 2) and a.type.name != "f16":
        raise InvalidType(f"{op}: ggml {'.'.join(map(str, RELEASE))} builds f16 columns here, "
                          f"which its CPU kernel computes from an f16 kernel only, not "
                          f"{a.type.name} (any float kernel from 0.20.2 on); convert the kernel "
                          "with gg.cpy(k, ctx.tensor(gg.f16, k.shape))")


def im2col(kernel: Tensor, data: Tensor, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           is_2d: bool = True, dtype: Any = "f32") -> Tensor:
    """ggml_im2col: unfold `data` into the columns a convolution with `kernel` multiplies.
    2-D: kernel (OC, IC, KH, KW), data (N, IC, H, W). 1-D: kernel (OC, IC, K), data (N, IC, L).
    stride/padding/dilation are (height, width) pairs or ints; the 1-D form uses width."""
    a, b = tensor(kernel, "im2col", "kernel"), tensor(data, "im2col", "data")
    args = _im2col_args(a, b, stride, padding, dilation, bool(is_2d))
    out_t = _types.of(dtype)
    require(out_t.name in ("f32", "f16"), "im2col: dtype must be f32 or f16", InvalidType)
    if out_t.name == "f16":
        _f16_columns(a, "im2col")
    return build(b, lib.ggml_im2col, a.ptr, b.ptr, *args, bool(is_2d), out_t,
                 ndim=4 if is_2d else 3, uses=(a,))


def conv_1d(kernel: Tensor, data: Tensor, stride: int = 1, padding: int = 0,
            dilation: int = 1) -> Tensor:
    """1-D convolution (cross-correlation, like torch): kernel (OC, IC, K), data (N, IC, L)
    -> (N, OC, L')."""
    a, b = tensor(kernel, "conv_1d", "kernel"), tensor(data, "conv_1d", "data")
    floats("conv_1d", a, b)
    require(a.is_contiguous, "conv_1d: the kernel must be contiguous")
    cpu_type(a, "conv_1d", "conv kernel")
    s0, _, p0, _, d0, _ = _im2col_args(a, b, (1, stride), (0, padding), (1, dilation), False)
    _f16_columns(a, "conv_1d")
    n, oc = b.ne[2], a.ne[2]

    def make(raw: Any, ka: Any, kb: Any) -> Any:
        p = lib.ggml_conv_1d(raw, ka, kb, s0, p0, d0)
        if n > 1:
            # ggml_conv_1d (0.25.3) labels its [OL, N, OC] product as [OL, OC, N] without
            # moving the data, which scrambles batches; put the axes where the label says
            p = lib.ggml_cont(raw, lib.ggml_permute(
                raw, lib.ggml_reshape_3d(raw, p, p.ne[0], n, oc), 0, 2, 1, 3))
        return p
    return build(b, make, a.ptr, b.ptr, ndim=3, uses=(a,), room=12)


def conv_2d(kernel: Tensor, data: Tensor, stride: Any = 1, padding: Any = 0,
            dilation: Any = 1) -> Tensor:
    """2-D convolution (cross-correlation, like torch's NCHW): kernel (OC, IC, KH, KW),
    data (N, IC, H, W) -> (N, OC, H', W'). stride/padding/dilation: int or (h, w)."""
    a, b = tensor(kernel, "conv_2d", "kernel"), tensor(data, "conv_2d", "data")
    floats("conv_2d", a, b)
    require(a.is_contiguous, "conv_2d: the kernel must be contiguous")
    cpu_type(a, "conv_2d", "conv kernel")
    args = _im2col_args(a, b, stride, padding, dilation, True)
    return build(b, lib.ggml_conv_2d, a.ptr, b.ptr, *args, ndim=4, uses=(a,), room=12)


def pool_2d(a: Tensor, kernel: Any, stride: Any = None, padding: Any = 0,
            op: str = "max") -> Tensor:
    """2-D max or average pooling over the last two numpy axes of f32 `a` (N, C, H, W).
    kernel/stride/padding: int or (h, w); stride defaults to the kernel."""
    a = tensor(a, "pool_2d")
    require(a.type.name == "f32", f"pool_2d: takes f32, got {a.type.name}", InvalidType)
    rows("pool_2d", ("a", a))
    ops = {"max": lib.GGML_OP_POOL_MAX, "avg": lib.GGML_OP_POOL_AVG}
    require(isinstance(op, str) and op in ops, f"pool_2d: op must be 'max' or 'avg', not {op!r}")
    k1, k0 = _pair(kernel, "kernel")
    s1, s0 = _pair(kernel if stride is None else stride, "stride")
    p1, p0 = _pair(padding, "padding")
    require(min(k0, k1, s0, s1) > 0 and min(p0, p1) >= 0 and p0 < k0 and p1 < k1,
            "pool_2d: kernel and stride must be positive, padding in 0..kernel-1")
    oh, ow = (a.ne[1] + 2 * p1 - k1) // s1 + 1, (a.ne[0] + 2 * p0 - k0) // s0 + 1
    require(oh > 0 and ow > 0, f"pool_2d: {a.shape} is smaller than the kernel ({k1}, {k0})")
    return build(a, lib.ggml_pool_2d, a.ptr, ops[op], k0, k1, s0, s1, float(p0), float(p1),
                 ndim=max(a.ndim, 2))


__all__ = ["im2col", "conv_1d", "conv_2d", "pool_2d"]
