"""Normalisation, softmax, rotary embeddings and fused attention, with ggml's parameter rules
(ggml.c's builders and the CPU kernels' asserts): eps >= 0, max_bias only with a mask,
contiguous softmax input and mask, rope modes and dimensions, attention head and batch shapes.
"""
from __future__ import annotations

from typing import Any

from .._tensor_base import TensorBase
from .._loader import BUILD, ffi, lib
from ..errors import InvalidType, require
from ._common import (Tensor, CHECKED_OPS, build, contiguous, cpu_mask, cpu_type, float_of, floats,
                      index_of, rows, rule, tensor)


# the types each kernel computes, for helpers.c's checked ops
_NORM, _RMS_NORM, _SOFT_MAX, _ROPE = (rule(cpu_mask(r)) for r in ("norm", "rms_norm",
                                                                  "soft_max", "rope_ext"))
_C_NORM: Any = CHECKED_OPS.ggml_py_norm if CHECKED_OPS is not None else None
_C_SOFT_MAX: Any = CHECKED_OPS.ggml_py_soft_max if CHECKED_OPS is not None else None
_C_ROPE: Any = CHECKED_OPS.ggml_py_rope if CHECKED_OPS is not None else None


def _eps(eps: Any, op: str) -> float:
    e = float_of(eps, f"{op}: eps")
    require(e >= 0.0, f"{op}: eps must be >= 0, got {e}")
    return e


def soft_max(a: Tensor, mask: Tensor | None = None, scale: float = 1.0,
             max_bias: float = 0.0) -> Tensor:
    """softmax over rows of `a` (the last numpy axis), with an optional additive mask."""
    cls = a.__class__
    if (cls.__base__ is TensorBase and _C_SOFT_MAX is not None and scale.__class__ is float
            and max_bias.__class__ is float):
        ctx = a.ctx
        if mask is None or (mask.__class__ is cls and mask.ctx is ctx):     # the rule, in C
            p = _C_SOFT_MAX(ctx.checked_state, a._p, ffi.NULL if mask is None else mask._p,
                            scale, max_bias, _SOFT_MAX)
            if p:
                return cls(p, ctx, a._ndim)
    a = tensor(a, "soft_max")
    cpu_type(a, "soft_max")
    scale, max_bias = float_of(scale, "soft_max: scale"), float_of(max_bias, "soft_max: max_bias")
    contiguous("soft_max", ("a", a))
    if mask is None:
        if scale == 1.0 and max_bias == 0.0:
            return build(a, lib.ggml_soft_max, a.ptr)
        require(max_bias <= 0.0, "soft_max: max_bias needs a mask (ALiBi slopes apply to it)")
        m = ffi.NULL
    else:
        mask = tensor(mask, "soft_max", "mask")
        require(mask.type.name in ("f32", "f16"), "soft_max: mask must be f32 or f16", InvalidType)
        require(mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1],
                f"soft_max: mask {mask.shape} does not cover {a.shape}")
        require(a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0,
                "soft_max: mask batch dims must divide a's")
        contiguous("soft_max", ("mask", mask))
        m = mask.ptr
    return build(a, lib.ggml_soft_max_ext, a.ptr, m, scale, max_bias,
                 uses=() if mask is None else (mask,))


def norm(a: Tensor, eps: float = 1e-5) -> Tensor:
    """Normalise each row to mean 0, variance 1 (ggml_norm); eps >= 0."""
    cls = a.__class__
    if cls.__base__ is TensorBase and _C_NORM is not None and eps.__class__ is float:
        ctx = a.ctx
        p = _C_NORM(ctx.checked_state, a._p, eps, _NORM, 0)      # the rule below, in C
        if p:
            return cls(p, ctx, a._ndim)
    a = tensor(a, "norm")
    cpu_type(a, "norm")
    eps = _eps(eps, "norm")
    rows("norm", ("a", a))
    return build(a, lib.ggml_norm, a.ptr, eps)


def rms_norm(a: Tensor, eps: float = 1e-6) -> Tensor:
    """Divide each row by its root mean square (ggml_rms_norm); eps >= 0."""
    cls = a.__class__
    if cls.__base__ is TensorBase and _C_NORM is not None and eps.__class__ is float:
        ctx = a.ctx
        p = _C_NORM(ctx.checked_state, a._p, eps, _RMS_NORM, 1)  # the rule below, in C
        if p:
            return cls(p, ctx, a._ndim)
    a = tensor(a, "rms_norm")
    cpu_type(a, "rms_norm")
    eps = _eps(eps, "rms_norm")
    rows("rms_norm", ("a", a))
    return build(a, lib.ggml_rms_norm, a.ptr, eps)


def group_norm(a: Tensor, n_groups: int, eps: float = 1e-6) -> Tensor:
    """Normalise each group of channels: `a` is (N, C, H, W) in numpy order (ggml ne
    [W, H, C, N]); the C channels split into `n_groups` groups of C / n_groups."""
    a = tensor(a, "group_norm")
    cpu_type(a, "group_norm")
    n_groups = index_of(n_groups, "group_norm: n_groups")
    eps = _eps(eps, "group_norm")
    contiguous("group_norm", ("a", a))
    require(1 <= n_groups <= a.ne[2] and a.ne[2] % n_groups == 0,
            f"group_norm: {a.ne[2]} channels do not split into {n_groups} groups")
    return build(a, lib.ggml_group_norm, a.ptr, n_groups, eps)


# GGML_ROPE_TYPE_NORMAL is 0 (named from 0.10 on; 0.9.4 defines NEOX only)
# ggml before 0.10 wants flash attention's mask rows padded to GGML_KQ_MASK_PAD (64)
_KQ_MASK_PAD = int(getattr(lib, "GGML_KQ_MASK_PAD", 1))
ROPE_NORMAL, ROPE_NEOX = int(getattr(lib, "GGML_ROPE_TYPE_NORMAL", 0)), int(lib.GGML_ROPE_TYPE_NEOX)


def rope_ext(a: Tensor, pos: Tensor, n_dims: int | None = None, mode: int = ROPE_NORMAL, *,
             freq_factors: Tensor | None = None,
             n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0,
             ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
             beta_slow: float = 1.0) -> Tensor:
    """Rotary position embedding (ggml_rope_ext). `a` is (batch, tokens, heads, head_dim) in
    numpy order; `pos` holds one i32 position per token. The first `n_dims` (default: all) of
    head_dim rotate: adjacent pairs (``gg.ROPE_NORMAL``) or halves (``gg.ROPE_NEOX``)."""
    cls = a.__class__
    if (cls.__base__ is TensorBase and pos.__class__ is cls and _C_ROPE is not None
            and freq_factors is None and pos.ctx is a.ctx
            and (n_dims is None or n_dims.__class__ is int) and mode.__class__ is int
            and n_ctx_orig.__class__ is int and freq_base.__class__ is float
            and freq_scale.__class__ is float and ext_factor.__class__ is float
            and attn_factor.__class__ is float and beta_fast.__class__ is float
            and beta_slow.__class__ is float and (n_dims is None or n_dims > 0)):
        ctx = a.ctx
        try:                                                    # the rule below, in C
            p = _C_ROPE(ctx.checked_state, a._p, pos._p, -1 if n_dims is None else n_dims,
                        mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                        beta_fast, beta_slow, _ROPE)
        except OverflowError:           # an int past C's: the Python path says which
            p = None
        if p:
            return cls(p, ctx, a._ndim)
    a, pos = tensor(a, "rope_ext"), tensor(pos, "rope_ext", "positions")
    cpu_type(a, "rope_ext")
    n_dims = a.ne[0] if n_dims is None else index_of(n_dims, "rope_ext: n_dims")
    mode = index_of(mode, "rope_ext: mode")
    n_ctx_orig = index_of(n_ctx_orig, "rope_ext: n_ctx_orig")
    fl = [float_of(v, f"rope_ext: {k}") for k, v in (
        ("freq_base", freq_base), ("freq_scale", freq_scale), ("ext_factor", ext_factor),
        ("attn_factor", attn_factor), ("beta_fast", beta_fast), ("beta_slow", beta_slow))]
    rows("rope_ext", ("a", a))
    require(mode in (ROPE_NORMAL, ROPE_NEOX), "rope_ext: mode must be gg.ROPE_NORMAL or "
                                              "gg.ROPE_NEOX (multi-section modes are not wrapped)")
    require(0 < n_dims <= a.ne[0] and n_dims % 2 == 0,
            f"rope_ext: n_dims={n_dims} must be even and at most head_dim={a.ne[0]}")
    require(pos.type.name == "i32", f"rope_ext: positions must be i32, got {pos.type.name}",
            InvalidType)
    require(pos.ne[1:] == (1, 1, 1) and pos.ne[0] == a.ne[2],
            f"rope_ext: need one position per token ({a.ne[2]}), got shape {pos.shape}")
    c = ffi.NULL
    if freq_factors is not None:
        freq_factors = tensor(freq_factors, "rope_ext", "freq_factors")
        require(freq_factors.type.name == "f32" and freq_factors.ne[0] >= n_dims // 2,
                f"rope_ext: freq_factors must be f32 with at least {n_dims // 2} values", InvalidType)
        c = freq_factors.ptr
    return build(a, lib.ggml_rope_ext, a.ptr, pos.ptr, c, n_dims, mode, n_ctx_orig, *fl,
                 uses=(pos,) if freq_factors is None else (pos, freq_factors))


def flash_attn_ext(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                   scale: float = 1.0, max_bias: float = 0.0,
                   logit_softcap: float = 0.0) -> Tensor:
    """Fused attention softmax(scale * q k^T + mask) v. numpy order: q (B, H, Nq, D),
    k (B, Hkv, Nkv, D), v (B, Hkv, Nkv, Dv), mask f16 (Nq', Nkv) with Nq' >= Nq; H a multiple
    of Hkv. The result is (B, Nq, H, Dv), f32 (ggml's permuted layout)."""
    q, k, v = (tensor(q, "flash_attn_ext", "q"), tensor(k, "flash_attn_ext", "k"),
               tensor(v, "flash_attn_ext", "v"))
    floats("flash_attn_ext", q, k, v)
    scale = float_of(scale, "flash_attn_ext: scale")
    max_bias = float_of(max_bias, "flash_attn_ext: max_bias")
    logit_softcap = float_of(logit_softcap, "flash_attn_ext: logit_softcap")
    rows("flash_attn_ext", ("q", q), ("k", k), ("v", v))
    require(k.ne[0] == q.ne[0], f"flash_attn_ext: q and k head sizes differ ({q.ne[0]}, {k.ne[0]})")
    require(q.ne[2] % k.ne[2] == 0 and q.ne[3] % k.ne[3] == 0,
            f"flash_attn_ext: q's heads/batch {q.ne[2:]} are not multiples of k's {k.ne[2:]}")
    require(q.ne[3] == k.ne[3] == v.ne[3], "flash_attn_ext: q, k and v batch sizes differ")
    require(v.ne[1] == k.ne[1] and v.ne[2] == k.ne[2],
            f"flash_attn_ext: v {v.shape} does not match k {k.shape} in keys and heads")
    m = ffi.NULL
    if mask is not None:
        mask = tensor(mask, "flash_attn_ext", "mask")
        require(mask.type.name == "f16", f"flash_attn_ext: mask must be f16, got {mask.type.name}",
                InvalidType)
        require(mask.is_contiguous, "flash_attn_ext: mask must be contiguous")
        require(mask.ne[0] == k.ne[1] and mask.ne[1] >= q.ne[1],
                f"flash_attn_ext: mask {mask.shape} does not cover ({q.ne[1]}, {k.ne[1]})")
        rows_needed = -(-q.ne[1] // _KQ_MASK_PAD) * _KQ_MASK_PAD
        require(mask.ne[1] >= rows_needed,
                f"flash_attn_ext: this build (ggml {BUILD['release']}) needs the mask's query "
                f"rows padded to a multiple of GGML_KQ_MASK_PAD={_KQ_MASK_PAD}: {rows_needed} "
                f"rows for {q.ne[1]} queries, got {mask.ne[1]} (ggml 0.10 dropped the padding)")
        require(q.ne[2] % mask.ne[2] == 0 and q.ne[3] % mask.ne[3] == 0,
                "flash_attn_ext: mask batch dims must divide q's")
        m = mask.ptr
    require(max_bias <= 0.0 or mask is not None, "flash_attn_ext: max_bias needs a mask")
    return build(q, lib.ggml_flash_attn_ext, q.ptr, k.ptr, v.ptr, m, scale, max_bias,
                 logit_softcap, ndim=4, uses=(k, v) if mask is None else (k, v, mask))


__all__ = ["soft_max", "norm", "rms_norm", "group_norm", "rope_ext", "ROPE_NORMAL", "ROPE_NEOX",
           "flash_attn_ext"]
