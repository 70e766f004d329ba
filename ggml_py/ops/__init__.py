"""ggml ops as Python functions, each validated by ggml's own rules before it reaches C.

Functions named after ggml's ops (``gg.add``, ``gg.mul_mat``...) have ggml's semantics: shapes
are ggml's ``ne``, broadcasting is ggml's "repeat" (the second operand tiles into the first),
and inputs must have the layout ggml's kernels need (a strided view is refused with a message
naming ``gg.cont``). Tensor operators (``a + b``, ``a @ b``) have numpy's semantics and are
built from these, making contiguous copies where numpy would accept any layout.

Families, each module with the type and layout rules of its ops:
``elementwise`` (add, mul, unary functions), ``reduce`` (sum, mean, argsort...), ``linalg``
(mul_mat, out_prod, matmul), ``shape`` (reshape, view, permute, cont, cpy, repeat, concat, pad),
``index`` (get_rows, set_rows), ``nn`` (soft_max, norms, rope, attention), ``conv`` (im2col,
convolutions, pooling). A result lives in the context of the operand that owns it (the first,
or the destination of cpy/set_rows) and keeps that context alive.
"""
from __future__ import annotations

from .conv import conv_1d, conv_2d, im2col, pool_2d
# the unary functions are in __all__ through *UNARY
from .elementwise import (UNARY, abs, add, cos, div, elu, exp, fill, gelu, gelu_quick,  # noqa: F401
                          hardsigmoid, hardswish, log, mul, neg, relu, scale, scale_bias, sgn,
                          sigmoid, silu, sin, sqr, sqrt, step, sub, tanh)
from .index import get_rows, set_rows
from .linalg import matmul, mul_mat, out_prod
from .nn import (ROPE_NEOX, ROPE_NORMAL, flash_attn_ext, group_norm, norm, rms_norm, rope_ext,
                 soft_max)
from .reduce import argmax, argsort, cumsum, mean, sum, sum_rows, top_k
from .shape import concat, cont, cpy, pad, permute, repeat, reshape, transpose, view

__all__ = [
    "add", "sub", "mul", "div", "scale", "scale_bias", "fill", *UNARY,
    "sum", "sum_rows", "mean", "argmax", "cumsum", "mul_mat", "out_prod", "matmul",
    "reshape", "view", "permute", "transpose", "cont", "cpy", "repeat", "concat", "pad",
    "get_rows", "set_rows", "argsort", "top_k", "soft_max", "norm", "rms_norm", "group_norm",
    "rope_ext", "ROPE_NORMAL", "ROPE_NEOX", "flash_attn_ext", "im2col", "conv_1d", "conv_2d",
    "pool_2d",
]


def __dir__() -> list[str]:       # dir() and help() show the module's API only
    return sorted(__all__)
