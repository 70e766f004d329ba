"""The op matrix: every op ggml_py exposes, its seeded inputs, and its numpy reference.

A case names the public ``gg.<op>`` call it makes, the inputs it needs (shape in numpy order
and a role: ``T`` takes the cell's type, other roles are fixed types), a numpy reference
computed from the inputs as the device holds them (read back after they were set, so
quantization of the inputs is not counted as the op's error), and the NMSE threshold.

Thresholds follow test-backend-ops (``max_nmse_err``: 1e-7 by default, 5e-4 for matrix
products and attention) where the result is f32; a result stored in a narrower type adds that
type's rounding (``TYPE_TOL``). Nothing here imports ggml_py: the parent process of a
comparison never loads a build; the workers pass ``gg`` in.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

TYPES = ("f32", "f16", "bf16", "f64", "i32", "i16", "i8", "q8_0", "q4_0")
DEFAULT_TOL = 1e-7                      # test-backend-ops' max_nmse_err
TYPE_TOL = {"f32": 0.0, "f64": 0.0, "i32": 0.0, "i16": 0.0, "i8": 0.0,
            "f16": 1e-6, "bf16": 1e-4, "q8_0": 1e-3, "q4_0": 2e-2}


@dataclass(frozen=True)
class In:
    shape: tuple[int, ...]
    role: str = "T"                      # "T" (the cell's type), "f32", "f16", "idx", "pos"
    domain: str = "normal"     # "normal", "positive", "away0" (|x| >= 0.5), "distinct", "intlike"


@dataclass(frozen=True)
class Case:
    op: str
    inputs: tuple[In, ...]
    build: Callable                      # (gg, *tensors) -> result tensor
    ref: Callable                        # (*arrays) -> numpy result
    tol: float = DEFAULT_TOL
    normalize: Callable | None = None    # applied to result and reference (unordered results)
    speed: tuple[In, ...] | None = None  # larger inputs for the speed table (f32 only)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _rope(x, pos, base=10000.0):
    """ggml_rope_ext, normal mode, all dims: x (B, tokens, heads, D), one position per token."""
    d = x.shape[-1]
    theta = pos[:, None].astype(np.float64) * base ** (-np.arange(0, d, 2) / d)   # (tokens, D/2)
    c, s = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def _attn(q, k, v):
    """q (B, H, Nq, D), k/v (B, H, Nkv, D): softmax(q k^T / sqrt(D)) v as (B, Nq, H, D)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    return np.swapaxes(_softmax(s) @ v, 1, 2)


def _group_norm(x, groups, eps=1e-6):
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    g = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    return g.reshape(x.shape)


def _im2col(kernel, data):
    oc, ic, kh, kw = kernel.shape
    n, _, h, w = data.shape
    oh, ow = h - kh + 1, w - kw + 1
    out = np.empty((n, oh, ow, ic * kh * kw))
    for i in range(oh):
        for j in range(ow):
            out[:, i, j] = data[:, :, i:i + kh, j:j + kw].reshape(n, -1)
    return out


def _conv2d(kernel, data):
    cols = _im2col(kernel, data)                          # (N, OH, OW, IC*KH*KW)
    out = cols @ kernel.reshape(kernel.shape[0], -1).T    # (N, OH, OW, OC)
    return out.transpose(0, 3, 1, 2)


def _conv1d(kernel, data):
    return _conv2d(kernel[:, :, None, :], data[:, :, None, :])[:, :, 0, :]


def _pool_max(x, k=2):
    n, c, h, w = x.shape
    return x[:, :, :h // k * k, :w // k * k].reshape(n, c, h // k, k, w // k, k).max(axis=(3, 5))


def _set_rows(dst, src, idx):
    out = dst.copy()
    out[idx] = src
    return out


M = (4, 32)                      # the matrix most cases use (rows of 32: whole quantized blocks)
BIG = (512, 512)                 # speed table inputs
_UNARY = {
    "relu": (lambda x: np.maximum(x, 0), "normal"), "gelu": (_gelu, "normal"),
    "silu": (lambda x: x * _sigmoid(x), "normal"), "tanh": (np.tanh, "normal"),
    "exp": (np.exp, "normal"), "sqr": (np.square, "normal"), "sqrt": (np.sqrt, "positive"),
    "log": (np.log, "positive"), "abs": (np.abs, "normal"), "neg": (np.negative, "normal"),
    "sigmoid": (_sigmoid, "normal"), "sin": (np.sin, "normal"), "cos": (np.cos, "normal"),
    "step": (lambda x: (x > 0).astype(np.float64), "away0"),
    "elu": (lambda x: np.where(x > 0, x, np.expm1(x)), "normal"),
    "gelu_quick": (lambda x: x * _sigmoid(1.702 * x), "normal"),
    "hardswish": (lambda x: x * np.clip((x + 3) / 6, 0, 1), "normal"),
    "hardsigmoid": (lambda x: np.clip((x + 3) / 6, 0, 1), "normal"),
    "sgn": (np.sign, "away0"),
}
# ggml's CPU computes gelu (and gelu_quick) through an f16 lookup table: a documented
# approximation, not a regression
_UNARY_TOL = {"gelu": 1e-5, "gelu_quick": 1e-5}


def _unary_case(name, ref, domain):
    return Case(name, (In(M, domain=domain),), lambda gg, a: getattr(gg, name)(a), ref,
                tol=_UNARY_TOL.get(name, DEFAULT_TOL), speed=(In(BIG, "f32", domain),))


CASES: list[Case] = [
    Case("add", (In(M), In(M)), lambda gg, a, b: gg.add(a, b), np.add,
         speed=(In(BIG, "f32"), In(BIG, "f32"))),
    Case("sub", (In(M), In(M)), lambda gg, a, b: gg.sub(a, b), np.subtract),
    Case("mul", (In(M), In(M)), lambda gg, a, b: gg.mul(a, b), np.multiply,
         speed=(In(BIG, "f32"), In(BIG, "f32"))),
    Case("div", (In(M), In(M, domain="away0")), lambda gg, a, b: gg.div(a, b), np.divide),
    Case("add f32 b", (In(M), In(M, "f32")), lambda gg, a, b: gg.add(a, b), np.add),
    Case("scale", (In(M),), lambda gg, a: gg.scale(a, 2.0), lambda a: 2.0 * a,
         speed=(In(BIG, "f32"),)),
    *[_unary_case(n, f, d) for n, (f, d) in _UNARY.items()],
    Case("sum", (In(M),), lambda gg, a: gg.sum(a), lambda a: np.array([a.sum()]), tol=1e-6),
    Case("sum_rows", (In(M),), lambda gg, a: gg.sum_rows(a), lambda a: a.sum(-1, keepdims=True),
         speed=(In(BIG, "f32"),)),
    Case("mean", (In(M),), lambda gg, a: gg.mean(a), lambda a: a.mean(-1, keepdims=True)),
    Case("argmax", (In(M, domain="distinct"),), lambda gg, a: gg.argmax(a),
         lambda a: np.argmax(a, -1)),
    Case("cumsum", (In(M),), lambda gg, a: gg.cumsum(a), lambda a: np.cumsum(a, -1), tol=1e-6),
    Case("mul_mat", (In(M), In((8, 32), "f32")), lambda gg, a, b: gg.mul_mat(a, b),
         lambda a, b: b @ a.T, tol=5e-4, speed=(In(BIG, "f32"), In(BIG, "f32"))),
    Case("mul_mat T b", (In(M), In((8, 32))), lambda gg, a, b: gg.mul_mat(a, b),
         lambda a, b: b @ a.T, tol=5e-4),
    Case("matmul", (In(M), In((32, 16))), lambda gg, a, b: a @ b, lambda a, b: a @ b, tol=5e-4),
    Case("out_prod", (In(M), In((4, 8), "f32")), lambda gg, a, b: gg.out_prod(a, b),
         lambda a, b: b.T @ a, tol=5e-4),
    Case("transpose", (In(M),), lambda gg, a: gg.cont(a.T), lambda a: a.T,
         speed=(In(BIG, "f32"),)),
    Case("reshape", (In(M),), lambda gg, a: gg.cont(a.reshape((32, 4))),
         lambda a: a.reshape(32, 4)),
    Case("permute", (In((1, 4, 2, 32)),), lambda gg, a: gg.cont(a.permute((0, 2, 1, 3))),
         lambda a: a.transpose(0, 2, 1, 3)),
    Case("concat", (In(M), In(M)), lambda gg, a, b: gg.concat(a, b, 0),
         lambda a, b: np.concatenate([a, b], 0)),
    Case("repeat", (In(M),), lambda gg, a: gg.repeat(a, (8, 32)), lambda a: np.tile(a, (2, 1))),
    Case("pad", (In(M),), lambda gg, a: gg.pad(a, [1, 1]), lambda a: np.pad(a, ((0, 1), (0, 1)))),
    Case("cpy to f32", (In(M), In(M, "f32")), lambda gg, a, b: gg.cpy(a, b), lambda a, b: a),
    Case("cpy from f32", (In(M, "f32", "intlike"), In(M)), lambda gg, a, b: gg.cpy(a, b), lambda a, b: a,
         speed=(In(BIG, "f32"), In(BIG, "f16"))),
    Case("get_rows", (In(M), In((4,), "idx")), lambda gg, a, i: gg.get_rows(a, i),
         lambda a, i: a[i], speed=(In(BIG, "f32"), In((512,), "idx"))),
    Case("set_rows", (In(M), In(M, "f32"), In((4,), "idx")),
         lambda gg, d, s, i: gg.set_rows(d, s, i), _set_rows),
    Case("soft_max", (In(M),), lambda gg, a: gg.soft_max(a), _softmax, tol=1e-6,
         speed=(In(BIG, "f32"),)),
    Case("soft_max mask", (In(M, "f32"), In(M)), lambda gg, a, m: gg.soft_max(a, mask=m),
         lambda a, m: _softmax(a + m), tol=1e-6),
    Case("norm", (In(M),), lambda gg, a: gg.norm(a),
         lambda a: (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5),
         tol=1e-6),
    Case("rms_norm", (In(M),), lambda gg, a: gg.rms_norm(a),
         lambda a: a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6), tol=1e-6,
         speed=(In(BIG, "f32"),)),
    Case("group_norm", (In((1, 4, 8, 32)),), lambda gg, a: gg.group_norm(a, 2),
         lambda a: _group_norm(a, 2), tol=1e-6),
    Case("rope_ext", (In((1, 4, 2, 32)), In((4,), "pos")), lambda gg, a, p: gg.rope_ext(a, p),
         _rope, tol=1e-6, speed=(In((1, 64, 8, 64), "f32"), In((64,), "pos"))),
    Case("flash_attn_ext", (In((1, 4, 8, 32), "f32"), In((1, 4, 8, 32)), In((1, 4, 8, 32))),
         lambda gg, q, k, v: gg.flash_attn_ext(q, k, v, scale=1 / math.sqrt(32)), _attn,
         tol=5e-4, speed=(In((1, 8, 64, 64), "f32"), In((1, 8, 256, 64), "f16"),
                          In((1, 8, 256, 64), "f16"))),
    Case("argsort", (In(M, domain="distinct"),), lambda gg, a: gg.argsort(a),
         lambda a: np.argsort(a, -1), speed=(In(BIG, "f32", "distinct"),)),
    Case("top_k", (In(M, domain="distinct"),), lambda gg, a: gg.top_k(a, 3),
         lambda a: np.argsort(-a, -1)[:, :3], normalize=lambda r: np.sort(r, -1)),
    Case("im2col", (In((2, 4, 3, 3)), In((1, 4, 8, 32), "f32")),
         lambda gg, k, d: gg.im2col(k, d), _im2col),
    Case("conv_1d", (In((2, 4, 3)), In((1, 4, 32), "f32")), lambda gg, k, d: gg.conv_1d(k, d),
         _conv1d, tol=5e-4),
    Case("conv_2d", (In((2, 4, 3, 3)), In((1, 4, 8, 32), "f32")),
         lambda gg, k, d: gg.conv_2d(k, d), _conv2d, tol=5e-4,
         speed=(In((16, 16, 3, 3), "f32"), In((1, 16, 64, 64), "f32"))),
    Case("pool_2d", (In((1, 4, 8, 32)),), lambda gg, a: gg.pool_2d(a, 2), _pool_max),
]
BY_OP = {c.op: c for c in CASES}


def seed(*parts: str) -> int:
    """A seed from the cell's name: the same inputs on both sides and on every device."""
    return int.from_bytes(hashlib.sha256("/".join(parts).encode()).digest()[:8], "little")


def values(spec: In, rng: np.random.Generator, n_rows: int | None = None) -> np.ndarray:
    """Seeded f32 (or i32) values for one input."""
    size = int(np.prod(spec.shape))
    if spec.role == "idx":
        # a permutation of the rows of the first input (every row written once by set_rows)
        return rng.permutation(n_rows or size).astype(np.int32)[:size].reshape(spec.shape)
    if spec.role == "pos":
        return rng.permutation(size).astype(np.int32).reshape(spec.shape)
    if spec.domain == "distinct":
        x = rng.permutation(size).astype(np.float32) / size - 0.5
    else:
        x = rng.standard_normal(size).astype(np.float32)
        if spec.domain == "positive":
            x = np.abs(x) + 0.1
        elif spec.domain == "away0":
            x = np.sign(x) * (np.abs(x) + 0.5)
        elif spec.domain == "intlike":       # whole numbers: exact in every type, i8 included
            x = np.round(x * 8)
    return x.reshape(spec.shape)


def nmse(got, ref) -> float:
    """test-backend-ops' metric: sum((got - ref)^2) / sum(ref^2); inf for NaN or shape mismatch."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.size != ref.size:
        return math.inf
    got, ref = got.reshape(-1), ref.reshape(-1)
    if not np.all(np.isfinite(got)):
        return math.inf
    den = float(np.sum(ref * ref))
    return float(np.sum((got - ref) ** 2) / (den if den else 1.0))


def threshold(case: Case, type_name: str) -> float:
    return max(case.tol, TYPE_TOL.get(type_name, 1e-3))
