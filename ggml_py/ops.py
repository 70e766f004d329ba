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
from .errors import InvalidArgument, InvalidType, UnsupportedError, require
from .registry import buffer_device, ensure_alive
from .tensor import MAX_DIMS, Tensor

FLOAT = ("f32", "f16", "bf16")


def _t(x, what="operand") -> Tensor:
    if not isinstance(x, Tensor):
        raise InvalidType(f"{what} must be a Tensor, not {type(x).__name__}")
    x.ptr  # closed context -> ClosedError
    return x


def _float(*ts) -> None:
    for t in ts:
        if t.type.name not in FLOAT:
            raise InvalidType(f"this op needs float tensors (f32/f16/bf16), got {t.type.name}")


# Types the backends' kernels compute, per op, where they are fewer than the op's own rules
# allow: ggml's CPU and CUDA backends report these ops as supported for any type and then abort
# in the kernel (0.25.3: ggml-cpu/ops.cpp, ggml-cuda/sum.cu and cpy.cu; found by
# tests/test_op_types.py). The CPU is every scheduler's fallback, so these are the rule.
CPU_TYPES = {
    "sum": {"f32"}, "scale": {"f32", "bf16"}, "sum_rows": {"f32"}, "mean": {"f32"}, "soft_max": {"f32"},
    "strided copy": {"f32", "f16", "bf16", "i32", "i16"},
    "norm": {"f32"}, "rms_norm": {"f32"}, "group_norm": {"f32"}, "rope_ext": {"f32", "f16"},
    "repeat": {"f32", "f16", "bf16", "i16", "i32", "i64"}, "im2col data": {"f32"},
    "conv kernel": {"f32", "f16"},
}


def _cpu_type(t: Tensor, op: str) -> None:
    if t.type.name not in CPU_TYPES[op]:
        raise InvalidType(f"{op}: ggml's kernels compute {'/'.join(sorted(CPU_TYPES[op]))}, "
                          f"not {t.type.name}; convert with gg.cpy(t, ctx.tensor(gg.f32, t.shape))")


def _out(p, like: Tensor, ndim: int | None = None) -> Tensor:
    """The result `p` as a Tensor of `like`'s context, with `ndim` numpy axes (default:
    like's, so leading axes of length 1 survive ops that keep the shape)."""
    src = p.view_src
    if src != ffi.NULL and src.buffer != ffi.NULL and p.buffer == ffi.NULL:
        ensure_alive(buffer_device(src.buffer))   # (the buffer's init_tensor may be remote)
        lib.ggml_backend_view_init(p)   # a view of allocated memory is usable at once
    return Tensor(p, like.ctx, ndim=like.ndim if ndim is None else ndim)


def _ctx(t: Tensor, n: int = 4):
    return t.ctx._room(n)


def _can_repeat(small: Tensor, big: Tensor) -> bool:
    return all(b % s == 0 for s, b in zip(small.ne, big.ne))


# -- elementwise binary ---------------------------------------------------------------------
def _binary(fn, a, b, name):
    a, b = _t(a), _t(b)
    _float(a, b)
    # (plain ifs: these checks run per op while graphs are built, messages only on failure)
    if not _can_repeat(b, a):
        raise InvalidArgument(f"{name}: shape {b.shape} does not repeat into {a.shape} "
                              "(each ggml dim of b must divide a's)")
    if a.type != b.type and b.type.name != "f32":
        raise InvalidType(f"{name}: mixed types {a.type.name} and {b.type.name}")
    return _out(fn(_ctx(a), a.ptr, b.ptr), a, max(a.ndim, b.ndim))


def add(a, b): return _binary(lib.ggml_add, a, b, "add")
def sub(a, b): return _binary(lib.ggml_sub, a, b, "sub")
def mul(a, b): return _binary(lib.ggml_mul, a, b, "mul")
def div(a, b): return _binary(lib.ggml_div, a, b, "div")


def scale(a, s: float):
    a = _t(a)
    _cpu_type(a, "scale")
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
    _cpu_type(a, "sum")
    return _out(lib.ggml_sum(_ctx(a), a.ptr), a, 1)


def sum_rows(a):
    a = _t(a)
    _cpu_type(a, "sum_rows")
    return _out(lib.ggml_sum_rows(_ctx(a), a.ptr), a)


def mean(a):
    """Mean of each row (ggml_mean)."""
    a = _t(a)
    _cpu_type(a, "mean")
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
    # f64/integer weights: ggml's CPU backend claims support, then has no dot product for them
    require(a.type.name in FLOAT or a.type.block_size > 1,
            f"mul_mat: a must be f32/f16/bf16 or quantized, got {a.type.name}", InvalidType)
    require(b.type.name in FLOAT, f"mul_mat: b must be a float tensor, got {b.type.name}", InvalidType)
    return _out(lib.ggml_mul_mat(_ctx(a), a.ptr, b.ptr), b, max(a.ndim, b.ndim, 2))


def out_prod(a, b):
    """ggml_out_prod: result ne = [a.ne0, b.ne0, b.ne2, b.ne3]."""
    a, b = _t(a), _t(b)
    require(a.type.name in FLOAT or a.type.block_size > 1,
            f"out_prod: a must be f32/f16/bf16 or quantized, got {a.type.name}", InvalidType)
    require(b.type.name == "f32", f"out_prod: b must be f32, got {b.type.name}", InvalidType)
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
    require(a.type.block_size == 1 or gperm[0] == 0,
            f"permute: the last axis of a {a.type.name} tensor holds its quantized blocks and "
            "cannot move", InvalidType)
    return _out(lib.ggml_permute(_ctx(a), a.ptr, *gperm), a, n)


def transpose(a):
    """Swap the last two numpy axes (ggml_transpose: ne0 <-> ne1), a view."""
    a = _t(a)
    require(a.type.block_size == 1, f"transpose: a {a.type.name} tensor's rows are quantized "
                                     "blocks; dequantize (gg.cpy to f32) first", InvalidType)
    return _out(lib.ggml_transpose(_ctx(a), a.ptr), a, max(a.ndim, 2))


def cont(a):
    """A contiguous copy of `a`."""
    a = _t(a)
    if not a.is_contiguous:                      # gathering a view: CUDA's copy kernels
        _cpu_type(a, "strided copy")
    return _out(lib.ggml_cont(_ctx(a), a.ptr), a)


def cpy(a, b):
    """Copy `a` into `b` (same element count; converts types ggml can convert)."""
    a, b = _t(a), _t(b)
    require(a.size == b.size, f"cpy: {a.size} elements into {b.size}")
    require(_can_convert(a.type, b.type),
            f"cpy: ggml's CPU backend does not convert {a.type.name} to {b.type.name}", InvalidType)
    if not (a.is_contiguous and b.is_contiguous):
        _cpu_type(a, "strided copy")
    return _out(lib.ggml_cpy(_ctx(a), a.ptr, b.ptr), b)


def _can_convert(src, dst) -> bool:
    """The conversions ggml's CPU copy kernel has (ggml_compute_forward_dup, 0.25.3)."""
    if src == dst:
        return True
    q = dst.block_size > 1
    return {"f16": dst.name in FLOAT or q, "bf16": dst.name in FLOAT or q,
            "f32": dst.name in FLOAT + ("i32",) or q, "i32": dst.name == "f32"}.get(
        src.name, src.block_size > 1 and dst.name == "f32")


def repeat(a, shape):
    """Tile `a` to numpy-order `shape` (each axis a multiple of a's)."""
    a = _t(a)
    _cpu_type(a, "repeat")
    shape = tuple(int(s) for s in shape)
    ne = list(reversed(shape)) + [1] * (4 - len(shape))
    require(all(n % m == 0 for m, n in zip(a.ne, ne)), f"repeat: {a.shape} does not tile into {shape}")
    p = lib.ggml_repeat_4d(_ctx(a), a.ptr, *ne)
    return _out(p, a, len(shape))


def concat(a, b, axis: int = 0):
    """numpy's ``np.concatenate([a, b], axis)``."""
    a, b = _t(a), _t(b)
    require(a.ndim == b.ndim, f"concat: {a.ndim}-D and {b.ndim}-D tensors ({a.shape}, {b.shape})")
    n = a.ndim
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
    require(a.type.name in FLOAT + ("i32",) or a.type.block_size > 1,
            f"get_rows: ggml's CPU backend reads rows of float, i32 or quantized tensors, not "
            f"{a.type.name}", InvalidType)
    require(a.ne[2] == idx.ne[1] and idx.ne[3] == 1 or (a.ne[2] == 1 and idx.ne[1] == 1),
            f"get_rows: index shape {idx.shape} does not fit {a.shape}")
    return _out(lib.ggml_get_rows(_ctx(a), a.ptr, idx.ptr), a, max(a.ndim, idx.ndim + 1))


# -- normalisation and attention ----------------------------------------------------------------
def soft_max(a, mask=None, scale: float = 1.0, max_bias: float = 0.0):
    """softmax over rows of `a` (the last numpy axis), with an optional additive mask."""
    a = _t(a)
    _cpu_type(a, "soft_max")
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
    _cpu_type(a, "norm")
    return _out(lib.ggml_norm(_ctx(a), a.ptr, float(eps)), a)


def rms_norm(a, eps: float = 1e-6):
    a = _t(a)
    _cpu_type(a, "rms_norm")
    return _out(lib.ggml_rms_norm(_ctx(a), a.ptr, float(eps)), a)


def group_norm(a, n_groups: int, eps: float = 1e-6):
    """Normalise each group of channels: `a` is (N, C, H, W) in numpy order (ggml ne
    [W, H, C, N]); the C channels split into `n_groups` groups of C / n_groups."""
    a = _t(a)
    _cpu_type(a, "group_norm")
    n_groups = int(n_groups)
    require(1 <= n_groups <= a.ne[2] and a.ne[2] % n_groups == 0,
            f"group_norm: {a.ne[2]} channels do not split into {n_groups} groups")
    return _out(lib.ggml_group_norm(_ctx(a), a.ptr, n_groups, float(eps)), a)


ROPE_NORMAL, ROPE_NEOX = int(lib.GGML_ROPE_TYPE_NORMAL), int(lib.GGML_ROPE_TYPE_NEOX)


def rope_ext(a, pos, n_dims: int | None = None, mode: int = ROPE_NORMAL, *, freq_factors=None,
             n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0,
             ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
             beta_slow: float = 1.0):
    """Rotary position embedding (ggml_rope_ext). `a` is (batch, tokens, heads, head_dim) in
    numpy order; `pos` holds one i32 position per token. The first `n_dims` (default: all) of
    head_dim rotate: adjacent pairs (``gg.ROPE_NORMAL``) or halves (``gg.ROPE_NEOX``)."""
    a, pos = _t(a), _t(pos, "positions")
    _cpu_type(a, "rope_ext")
    n_dims = a.ne[0] if n_dims is None else int(n_dims)
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
        freq_factors = _t(freq_factors, "freq_factors")
        require(freq_factors.type.name == "f32" and freq_factors.ne[0] >= n_dims // 2,
                f"rope_ext: freq_factors must be f32 with at least {n_dims // 2} values", InvalidType)
        c = freq_factors.ptr
    p = lib.ggml_rope_ext(_ctx(a), a.ptr, pos.ptr, c, n_dims, int(mode), int(n_ctx_orig),
                          float(freq_base), float(freq_scale), float(ext_factor),
                          float(attn_factor), float(beta_fast), float(beta_slow))
    return _out(p, a)


def flash_attn_ext(q, k, v, mask=None, scale: float = 1.0, max_bias: float = 0.0,
                   logit_softcap: float = 0.0):
    """Fused attention softmax(scale * q k^T + mask) v. numpy order: q (B, H, Nq, D),
    k (B, Hkv, Nkv, D), v (B, Hkv, Nkv, Dv), mask f16 (Nq', Nkv) with Nq' >= Nq; H a multiple
    of Hkv. The result is (B, Nq, H, Dv), f32 (ggml's permuted layout)."""
    q, k, v = _t(q, "q"), _t(k, "k"), _t(v, "v")
    _float(q, k, v)
    require(k.ne[0] == q.ne[0], f"flash_attn_ext: q and k head sizes differ ({q.ne[0]}, {k.ne[0]})")
    require(q.ne[2] % k.ne[2] == 0 and q.ne[3] % k.ne[3] == 0,
            f"flash_attn_ext: q's heads/batch {q.ne[2:]} are not multiples of k's {k.ne[2:]}")
    require(q.ne[3] == k.ne[3] == v.ne[3], "flash_attn_ext: q, k and v batch sizes differ")
    require(v.ne[1] == k.ne[1] and v.ne[2] == k.ne[2],
            f"flash_attn_ext: v {v.shape} does not match k {k.shape} in keys and heads")
    m = ffi.NULL
    if mask is not None:
        mask = _t(mask, "mask")
        require(mask.type.name == "f16", f"flash_attn_ext: mask must be f16, got {mask.type.name}",
                InvalidType)
        require(mask.is_contiguous, "flash_attn_ext: mask must be contiguous")
        require(mask.ne[0] == k.ne[1] and mask.ne[1] >= q.ne[1],
                f"flash_attn_ext: mask {mask.shape} does not cover ({q.ne[1]}, {k.ne[1]})")
        require(q.ne[2] % mask.ne[2] == 0 and q.ne[3] % mask.ne[3] == 0,
                "flash_attn_ext: mask batch dims must divide q's")
        m = mask.ptr
    require(max_bias <= 0.0 or mask is not None, "flash_attn_ext: max_bias needs a mask")
    p = lib.ggml_flash_attn_ext(_ctx(q), q.ptr, k.ptr, v.ptr, m, float(scale), float(max_bias),
                                float(logit_softcap))
    return _out(p, q, 4)


# -- indexing and sorting --------------------------------------------------------------------
def set_rows(dst, src, idx):
    """``dst[idx] = src`` row-wise (ggml_set_rows): returns `dst` as updated by the graph.
    dst (..., R, n), src (..., r, n) f32/f16, idx (r,) i32 or i64 with 0 <= idx < R."""
    dst, src, idx = _t(dst, "dst"), _t(src, "src"), _t(idx, "indices")
    require(src.type.name in ("f32", "f16"), f"set_rows: src must be f32 or f16, got {src.type.name}",
            InvalidType)
    require(dst.type.name in FLOAT or dst.type.block_size > 1,
            f"set_rows: rows convert into float or quantized tensors, not {dst.type.name}",
            InvalidType)
    require(idx.type.name in ("i32", "i64"), f"set_rows: indices must be i32 or i64, got "
                                             f"{idx.type.name}", InvalidType)
    require(dst.ne[0] == src.ne[0] and dst.ne[2:] == src.ne[2:],
            f"set_rows: rows of {src.shape} do not fit {dst.shape}")
    require(src.ne[1] == idx.ne[0] and src.ne[2] % idx.ne[1] == 0 and src.ne[3] % idx.ne[2] == 0
            and idx.ne[3] == 1, f"set_rows: {idx.shape} indices for {src.ne[1]} rows")
    for t, what in ((dst, "dst"), (src, "src")):
        require(bool(lib.ggml_is_contiguous_rows(t.ptr)), f"set_rows: {what} rows must be contiguous")
    return _out(lib.ggml_set_rows(_ctx(dst), dst.ptr, src.ptr, idx.ptr), dst)


def argsort(a, descending: bool = False):
    """Indices (i32) that sort each row of f32 `a`."""
    a = _t(a)
    require(a.type.name == "f32", f"argsort takes f32, got {a.type.name}", InvalidType)
    order = lib.GGML_SORT_ORDER_DESC if descending else lib.GGML_SORT_ORDER_ASC
    return _out(lib.ggml_argsort(_ctx(a), a.ptr, order), a)


def top_k(a, k: int):
    """Indices (i32) of the `k` largest values of each row, in no particular order."""
    a = _t(a)
    require(a.type.name == "f32", f"top_k takes f32, got {a.type.name}", InvalidType)
    k = int(k)
    require(1 <= k <= a.ne[0], f"top_k: k={k} must be in 1..{a.ne[0]}")
    fn = getattr(lib, "ggml_top_k", None)
    require(fn is not None, "top_k is not in this ggml release", UnsupportedError)
    return _out(fn(_ctx(a), a.ptr, k), a)


def cumsum(a):
    """Running sum along each row (the last numpy axis), f32."""
    a = _t(a)
    require(a.type.name == "f32", f"cumsum takes f32, got {a.type.name}", InvalidType)
    fn = getattr(lib, "ggml_cumsum", None)
    require(fn is not None, "cumsum is not in this ggml release", UnsupportedError)
    return _out(fn(_ctx(a), a.ptr), a)


def pad(a, widths):
    """Zero padding, numpy's ``np.pad(a, widths)``: one (before, after) pair per axis, or one
    int per axis meaning (0, int)."""
    a = _t(a)
    require(a.type.name == "f32", f"pad takes f32, got {a.type.name}", InvalidType)
    widths = list(widths)
    require(len(widths) == a.ndim, f"pad: {len(widths)} widths for {a.ndim} axes")
    pairs = [(0, int(w)) if isinstance(w, (int, np.integer)) else tuple(int(x) for x in w)
             for w in widths]
    require(all(len(p) == 2 and p[0] >= 0 and p[1] >= 0 for p in pairs),
            f"pad: widths {widths} must be non-negative (before, after) pairs")
    g = list(reversed(pairs)) + [(0, 0)] * (4 - len(pairs))   # ggml dim order
    if any(lo for lo, _ in g):
        fn = getattr(lib, "ggml_pad_ext", None)
        require(fn is not None, "pad before an axis needs ggml_pad_ext, not in this release",
                UnsupportedError)
        p = fn(_ctx(a), a.ptr, *(x for pair in g for x in pair))
    else:
        p = lib.ggml_pad(_ctx(a), a.ptr, *(hi for _, hi in g))
    return _out(p, a)


# -- convolution and pooling -------------------------------------------------------------------
def _conv_size(n, k, s, p, d) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _pair(x, what):
    x = (x, x) if isinstance(x, (int, np.integer)) else tuple(x)
    require(len(x) == 2 and all(isinstance(v, (int, np.integer)) for v in x),
            f"{what} must be an int or a pair of ints")
    return int(x[0]), int(x[1])


def _im2col_args(a, b, stride, padding, dilation, is_2d):
    """Validated (s0, s1, p0, p1, d0, d1) in ggml's order, by ggml_im2col's rules."""
    _cpu_type(b, "im2col data")
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


def im2col(kernel, data, stride=1, padding=0, dilation=1, is_2d: bool = True, dtype="f32"):
    """ggml_im2col: unfold `data` into the columns a convolution with `kernel` multiplies.
    2-D: kernel (OC, IC, KH, KW), data (N, IC, H, W). 1-D: kernel (OC, IC, K), data (N, IC, L).
    stride/padding/dilation are (height, width) pairs or ints; the 1-D form uses width."""
    a, b = _t(kernel, "kernel"), _t(data, "data")
    args = _im2col_args(a, b, stride, padding, dilation, is_2d)
    out_t = T.of(dtype)
    require(out_t.name in ("f32", "f16"), "im2col: dtype must be f32 or f16", InvalidType)
    p = lib.ggml_im2col(_ctx(b), a.ptr, b.ptr, *args, bool(is_2d), out_t)
    return _out(p, b, 4 if is_2d else 3)


def conv_1d(kernel, data, stride: int = 1, padding: int = 0, dilation: int = 1):
    """1-D convolution (cross-correlation, like torch): kernel (OC, IC, K), data (N, IC, L)
    -> (N, OC, L')."""
    a, b = _t(kernel, "kernel"), _t(data, "data")
    _float(a, b)
    require(a.is_contiguous, "conv_1d: the kernel must be contiguous")
    _cpu_type(a, "conv kernel")
    s0, _, p0, _, d0, _ = _im2col_args(a, b, (1, stride), (0, padding), (1, dilation), False)
    raw = _ctx(b, 12)
    p = lib.ggml_conv_1d(raw, a.ptr, b.ptr, s0, p0, d0)
    n, oc, ol = b.ne[2], a.ne[2], p.ne[0]
    if n > 1:
        # ggml_conv_1d (0.25.3) labels its [OL, N, OC] product as [OL, OC, N] without moving
        # the data, which scrambles batches; put the axes where the label says they are
        p = lib.ggml_cont(raw, lib.ggml_permute(raw, lib.ggml_reshape_3d(raw, p, ol, n, oc),
                                                0, 2, 1, 3))
    return _out(p, b, 3)


def conv_2d(kernel, data, stride=1, padding=0, dilation=1):
    """2-D convolution (cross-correlation, like torch's NCHW): kernel (OC, IC, KH, KW),
    data (N, IC, H, W) -> (N, OC, H', W'). stride/padding/dilation: int or (h, w)."""
    a, b = _t(kernel, "kernel"), _t(data, "data")
    _float(a, b)
    require(a.is_contiguous, "conv_2d: the kernel must be contiguous")
    _cpu_type(a, "conv kernel")
    args = _im2col_args(a, b, stride, padding, dilation, True)
    return _out(lib.ggml_conv_2d(_ctx(b, 12), a.ptr, b.ptr, *args), b, 4)


def pool_2d(a, kernel, stride=None, padding=0, op: str = "max"):
    """2-D max or average pooling over the last two numpy axes of f32 `a` (N, C, H, W).
    kernel/stride/padding: int or (h, w); stride defaults to the kernel."""
    a = _t(a)
    require(a.type.name == "f32", f"pool_2d takes f32, got {a.type.name}", InvalidType)
    ops = {"max": lib.GGML_OP_POOL_MAX, "avg": lib.GGML_OP_POOL_AVG}
    require(op in ops, f"pool_2d: op must be 'max' or 'avg', not {op!r}")
    k1, k0 = _pair(kernel, "kernel")
    s1, s0 = _pair(kernel if stride is None else stride, "stride")
    p1, p0 = _pair(padding, "padding")
    require(min(k0, k1, s0, s1) > 0 and min(p0, p1) >= 0 and p0 < k0 and p1 < k1,
            "pool_2d: kernel and stride must be positive, padding in 0..kernel-1")
    oh, ow = (a.ne[1] + 2 * p1 - k1) // s1 + 1, (a.ne[0] + 2 * p0 - k0) // s0 + 1
    require(oh > 0 and ow > 0, f"pool_2d: {a.shape} is smaller than the kernel ({k1}, {k0})")
    return _out(lib.ggml_pool_2d(_ctx(a), a.ptr, ops[op], k0, k1, s0, s1, float(p0), float(p1)),
                a, max(a.ndim, 2))


# -- numpy semantics for Tensor operators ---------------------------------------------------------
def _broadcast(a, b, name):
    """(a', b') with numpy broadcasting made explicit where ggml's repeat rule needs it."""
    if a.ne == b.ne and a.ndim == b.ndim:
        return a, b
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

__all__ = [
    "add", "sub", "mul", "div", "scale", *[n for n in _UNARY if n in globals()],
    "sum", "sum_rows", "mean", "argmax", "cumsum", "mul_mat", "out_prod", "matmul",
    "reshape", "view", "permute", "transpose", "cont", "cpy", "repeat", "concat", "pad",
    "get_rows", "set_rows", "argsort", "top_k", "soft_max", "norm", "rms_norm", "group_norm",
    "rope_ext", "ROPE_NORMAL", "ROPE_NEOX", "flash_attn_ext", "im2col", "conv_1d", "conv_2d",
    "pool_2d",
]
