"""Matrix products: ggml's mul_mat and out_prod, and numpy's matmul built from them.

ggml's rules (ggml.c ``ggml_can_mul_mat``, ggml-cpu ``ggml_compute_forward_mul_mat``): equal
inner dims, b's batch dims multiples of a's, a not transposed, both with packed rows; the CPU
has dot products only for float and quantized weights.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .._tensor_base import TensorBase
from .._loader import lib
from ..errors import InvalidArgument, InvalidType, require
from .._types import TYPES
from ._common import (Tensor, CHECKED_OPS, FLOAT, FLOAT_MASK, blas_rows, blas_rows_ok, build,
                      cpu_type, prod, rows, rule, tensor, type_mask)
from .shape import cont, repeat, reshape, transpose


# mul_mat's `a`: float or quantized (the CPU has dot products for those only)
_MM_A = rule(type_mask(n for n, t in TYPES.items() if n in FLOAT or t.block_size > 1))
_MM_B = rule(FLOAT_MASK)
_C_MUL_MAT: Any = CHECKED_OPS.ggml_py_mul_mat if CHECKED_OPS is not None else None


def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat: result ne = [a.ne1, b.ne1, b.ne2, b.ne3] (numpy: b @ a.T), f32."""
    cls = a.__class__
    if cls.__base__ is TensorBase and b.__class__ is cls and _C_MUL_MAT is not None:
        ctx = a.ctx
        if b.ctx is ctx:                # the rule below in one C call (helpers.c)
            p = _C_MUL_MAT(ctx.checked_state, a._p, b._p, _MM_A, _MM_B)
            if p:
                nd, nd_b = a._ndim, b._ndim
                return cls(p, ctx, nd if nd >= nd_b and nd >= 2 else nd_b if nd_b >= 2 else 2)
    a, b = tensor(a, "mul_mat", "a"), tensor(b, "mul_mat", "b")
    require(a.ne[0] == b.ne[0], f"mul_mat: inner dims differ (a.ne0={a.ne[0]}, b.ne0={b.ne[0]})")
    require(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0,
            f"mul_mat: b's batch dims {b.ne[2:]} must be multiples of a's {a.ne[2:]}")
    require(not a.is_transposed, "mul_mat: a must not be transposed; use gg.cont(a)")
    # f64/integer weights: ggml's CPU backend claims support, then has no dot product for them
    require(a.type.name in FLOAT or a.type.block_size > 1,
            f"mul_mat: a must be f32/f16/bf16 or quantized, got {a.type.name}", InvalidType)
    require(b.type.name in FLOAT, f"mul_mat: b must be a float tensor, got {b.type.name}",
            InvalidType)
    rows("mul_mat", ("a", a), ("b", b))
    blas_rows("mul_mat", ("a", a), ("b", b))
    return build(a, lib.ggml_mul_mat, a.ptr, b.ptr, ndim=max(a.ndim, b.ndim, 2), uses=(b,))


def out_prod(a: Tensor, b: Tensor) -> Tensor:
    """ggml_out_prod: result ne = [a.ne0, b.ne0, b.ne2, b.ne3]."""
    a, b = tensor(a, "out_prod", "a"), tensor(b, "out_prod", "b")
    require(a.type.name in FLOAT or a.type.block_size > 1,
            f"out_prod: a must be f32/f16/bf16 or quantized, got {a.type.name}", InvalidType)
    require(b.type.name == "f32", f"out_prod: b must be f32, got {b.type.name}", InvalidType)
    cpu_type(a, "out_prod", "out_prod a")     # bf16: the CPU kernel aborts (0.25.3, 0.26.0)
    require(a.ne[1] == b.ne[1], f"out_prod: a.ne1={a.ne[1]} != b.ne1={b.ne[1]}")
    require(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0,
            "out_prod: b's batch dims must be multiples of a's")
    rows("out_prod", ("a", a))
    blas_rows("out_prod", ("a", a))
    return build(a, lib.ggml_out_prod, a.ptr, b.ptr, ndim=max(a.ndim, b.ndim, 2), uses=(b,))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """numpy's ``a @ b`` (last two axes, batch axes broadcast), any layout of a and b."""
    a, b = tensor(a, "matmul", "a"), tensor(b, "matmul", "b")
    a2 = reshape(_packed(a), (1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape(_packed(b), (b.shape[0], 1)) if b.ndim == 1 else b
    sa, sb = a2.shape, b2.shape
    require(sa[-1] == sb[-2], f"matmul: shapes {a.shape} and {b.shape} are not aligned "
                              f"({sa[-1]} != {sb[-2]})")
    batch_a, batch_b = sa[:-2], sb[:-2]
    try:
        batch = tuple(np.broadcast_shapes(batch_a, batch_b))
    except ValueError:
        raise InvalidArgument(f"matmul: batch shapes {batch_a} and {batch_b} do not broadcast") from None
    require(len(batch) <= 2, "matmul: supports up to 2 batch axes")
    require(a.type.name in FLOAT and b.type.name in FLOAT,
            f"matmul: takes float tensors, got {a.type.name} @ {b.type.name}", InvalidType)
    bt = cont(transpose(b2))                     # ne [K, N, ...]: rows of B^T
    full = batch + sa[-2:]
    a2 = _packed(a2)
    if prod(batch_a) != prod(batch) or len(batch_a) != len(batch):
        a2 = repeat(a2, full) if a2.shape != full else a2
    out = mul_mat(bt, a2)                        # ne [N, M, batch...] = (..., M, N)
    shape = batch + (sa[-2], sb[-1])
    out._ndim = len(shape)
    if a.ndim == 1 or b.ndim == 1:
        keep = [d for d, drop in zip(shape, [False] * len(batch) + [a.ndim == 1, b.ndim == 1])
                if not drop]
        return reshape(out, tuple(keep) or (1,))
    return out


def _packed(t: Tensor) -> Tensor:
    """`t` itself when contiguous, else a contiguous copy (numpy semantics take any layout)."""
    # (ggml_is_contiguous ignores axes of length 1: a transposed (n, 1) view passes it with
    # strided rows, which mul_mat's kernel refuses)
    # (and it lets such a view keep a row stride shorter than a row, which cuBLAS refuses)
    return t if t.is_contiguous and t.nb[0] == t.type.type_size and blas_rows_ok(t) else cont(t)


__all__ = ["mul_mat", "out_prod", "matmul"]
