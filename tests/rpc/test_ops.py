"""Every op computed on every device and checked against numpy with test-backend-ops' NMSE
thresholds; every refused op input raises the check named by its message, and the process
keeps working."""
import re
from pathlib import Path

import numpy as np
import pytest

import ggml_py as gg
from support import RELEASE, nmse

T_DEFAULT, T_MATMUL, T_SOFTMAX = 1e-7, 5e-4, 1e-6


def _sm(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _norm(x, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps)


X = np.random.default_rng(7).standard_normal((3, 4, 16)).astype(np.float32)
Y = np.random.default_rng(8).standard_normal((3, 4, 16)).astype(np.float32)
ROW = np.random.default_rng(9).standard_normal((16,)).astype(np.float32)
POS = np.abs(X) + 0.5
_r = np.random.default_rng(10)
IMG = _r.standard_normal((2, 3, 9, 8)).astype(np.float32)          # N, C, H, W
KER = _r.standard_normal((4, 3, 3, 2)).astype(np.float32)          # OC, IC, KH, KW
SIG = _r.standard_normal((2, 3, 12)).astype(np.float32)            # N, C, L
KER1 = _r.standard_normal((4, 3, 3)).astype(np.float32)            # OC, IC, K
HEADS = _r.standard_normal((1, 6, 2, 8)).astype(np.float32)        # batch, tokens, heads, dim
POSITIONS = (np.arange(6) + 3).astype(np.int32)
Q = _r.standard_normal((1, 4, 5, 16)).astype(np.float32)           # B, H, Nq, D
K = _r.standard_normal((1, 2, 7, 16)).astype(np.float16)           # B, Hkv, Nkv, D
V = _r.standard_normal((1, 2, 7, 16)).astype(np.float16)
KQ_MASK = np.where(np.arange(7) < 5, 0, -np.inf).astype(np.float16)[None].repeat(5, 0)
# the mask as flash_attn_ext takes it: rows padded to 64 (ggml before 0.10 requires
# GGML_KQ_MASK_PAD rows; later releases read the first Nq)
KQ_MASK_PADDED = KQ_MASK[:1].repeat(64, 0)
TABLE = _r.standard_normal((6, 16)).astype(np.float32)
NEW_ROWS = _r.standard_normal((2, 16)).astype(np.float32)
ROW_IDX = np.array([4, 1], np.int64)
WIDE = X * 3


def _gelu(x):
    # ggml's CPU gelu reads a half-precision table: gelu(f16(x)) rounded to f16
    h = x.astype(np.float16).astype(np.float32)
    y = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    return np.where(np.abs(x) < 10, y.astype(np.float16).astype(np.float32), y)


def _group_norm(x, groups, eps=1e-6):
    g = x.reshape(x.shape[0], groups, -1)
    return ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)


def _rope(x, pos, n_dims, neox, base=10000.0):
    out, d = x.copy(), n_dims
    theta = pos[:, None] * base ** (-np.arange(0, d, 2) / d)          # (tokens, d/2)
    c, s = np.cos(theta)[None, :, None], np.sin(theta)[None, :, None]
    x0, x1 = (x[..., :d // 2], x[..., d // 2:d]) if neox else (x[..., 0:d:2], x[..., 1:d:2])
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    if neox:
        out[..., :d // 2], out[..., d // 2:d] = y0, y1
    else:
        out[..., 0:d:2], out[..., 1:d:2] = y0, y1
    return out


def _conv2d(x, w, s, p, d):
    """Direct cross-correlation in float64 (torch's conv2d semantics), NCHW."""
    n, _, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])])
    oh = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    ow = (wd + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    out = np.zeros((n, oc, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * d[0]:i * d[0] + s[0] * (oh - 1) + 1:s[0],
                       j * d[1]:j * d[1] + s[1] * (ow - 1) + 1:s[1]]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def _attention(q, k, v, mask, scale):
    rep = q.shape[1] // k.shape[1]
    kk, vv = (np.repeat(t.astype(np.float64), rep, 1) for t in (k, v))
    s = q @ kk.transpose(0, 1, 3, 2) * scale + mask.astype(np.float64)
    return (_sm(s) @ vv).transpose(0, 2, 1, 3)                        # (B, Nq, H, Dv)


def _set_rows(table, rows, idx):
    out = table.copy()
    out[idx] = rows
    return out

# name: (inputs, build(gg tensors) -> tensor, numpy reference, threshold)
OPS = {
    "add": ((X, Y), lambda a, b: a + b, X + Y, T_DEFAULT),
    "add broadcast": ((X, ROW), lambda a, b: a + b, X + ROW, T_DEFAULT),
    "sub": ((X, Y), lambda a, b: a - b, X - Y, T_DEFAULT),
    "mul": ((X, Y), lambda a, b: a * b, X * Y, T_DEFAULT),
    "div": ((X, POS), lambda a, b: a / b, X / POS, T_DEFAULT),
    "scale": ((X,), lambda a: a * 0.5, X * 0.5, T_DEFAULT),
    "neg": ((X,), lambda a: -a, -X, T_DEFAULT),
    "relu": ((X,), gg.relu, np.maximum(X, 0), T_DEFAULT),
    "silu": ((X,), gg.silu, X / (1 + np.exp(-X)), T_DEFAULT),
    "tanh": ((X,), gg.tanh, np.tanh(X), T_DEFAULT),
    "sigmoid": ((X,), gg.sigmoid, 1 / (1 + np.exp(-X)), T_DEFAULT),
    "exp": ((X,), gg.exp, np.exp(X), T_DEFAULT),
    "sqr": ((X,), gg.sqr, X * X, T_DEFAULT),
    "sqrt": ((POS,), gg.sqrt, np.sqrt(POS), T_DEFAULT),
    "log": ((POS,), gg.log, np.log(POS), T_DEFAULT),
    "abs": ((X,), gg.abs, np.abs(X), T_DEFAULT),
    "sum": ((X,), gg.sum, X.sum(keepdims=True).reshape(1), T_DEFAULT),
    "sum_rows": ((X,), gg.sum_rows, X.sum(-1, keepdims=True), T_DEFAULT),
    "mean": ((X,), gg.mean, X.mean(-1, keepdims=True), T_DEFAULT),
    "matmul": ((X[0], Y[0].T.copy()), lambda a, b: a @ b, X[0] @ Y[0].T, T_MATMUL),
    "matmul batched": ((X, np.swapaxes(Y, 1, 2).copy()), lambda a, b: a @ b,
                       X @ np.swapaxes(Y, 1, 2), T_MATMUL),
    "mul_mat": ((X[0], Y[0]), gg.mul_mat, Y[0] @ X[0].T, T_MATMUL),
    "transpose+cont": ((X[0],), lambda a: gg.cont(a.T), X[0].T, T_DEFAULT),
    "permute+cont": ((X,), lambda a: gg.cont(a.permute((2, 0, 1))), X.transpose(2, 0, 1), T_DEFAULT),
    "reshape": ((X,), lambda a: a.reshape((12, 16)) * 1.0, X.reshape(12, 16), T_DEFAULT),
    "concat": ((X, Y), lambda a, b: gg.concat(a, b, axis=1), np.concatenate([X, Y], 1), T_DEFAULT),
    "repeat": ((ROW,), lambda a: gg.repeat(a, (3, 16)), np.tile(ROW, (3, 1)), T_DEFAULT),
    "soft_max": ((X,), gg.soft_max, _sm(X), T_SOFTMAX),
    "soft_max scaled": ((X,), lambda a: gg.soft_max(a, scale=0.5), _sm(X * 0.5), T_SOFTMAX),
    "norm": ((X,), gg.norm, _norm(X), T_DEFAULT),
    "rms_norm": ((X,), gg.rms_norm, X / np.sqrt((X * X).mean(-1, keepdims=True) + 1e-6), T_DEFAULT),
    "gelu": ((WIDE,), gg.gelu, _gelu(WIDE), T_DEFAULT),
    "argmax": ((X[0],), gg.argmax, X[0].argmax(-1), 0),
    "out_prod": ((X[0], Y[0]), gg.out_prod, Y[0].T @ X[0], T_MATMUL),
    "group_norm": ((IMG,), lambda a: gg.group_norm(a, 3), _group_norm(IMG, 3), T_DEFAULT),
    "rope_ext normal": ((HEADS, POSITIONS), lambda a, p: gg.rope_ext(a, p),
                        _rope(HEADS, POSITIONS, 8, False), T_DEFAULT),
    "rope_ext neox partial": ((HEADS, POSITIONS), lambda a, p: gg.rope_ext(a, p, 4, gg.ROPE_NEOX),
                              _rope(HEADS, POSITIONS, 4, True), T_DEFAULT),
    "get_rows": ((TABLE, ROW_IDX.astype(np.int32)), gg.get_rows, TABLE[ROW_IDX], 0),
    "set_rows": ((TABLE, NEW_ROWS, ROW_IDX), gg.set_rows, _set_rows(TABLE, NEW_ROWS, ROW_IDX), 0),
    "pad": ((X,), lambda a: gg.pad(a, [2, (0, 1), 3]), np.pad(X, [(0, 2), (0, 1), (0, 3)]), 0),
    "pad both sides": ((X[0],), lambda a: gg.pad(a, [(1, 2), (3, 0)]), np.pad(X[0], [(1, 2), (3, 0)]), 0),
    "im2col": ((KER, IMG), lambda k, x: gg.im2col(k, x).view((18,)), IMG[0, :, 0:3, 0:2].reshape(-1), 0),
    "conv_1d": ((KER1, SIG), lambda k, x: gg.conv_1d(k, x, 2, 1, 1),
                _conv2d(SIG[:, :, None], KER1[:, :, None], (1, 2), (0, 1), (1, 1))[:, :, 0], T_MATMUL),
    "conv_2d": ((KER, IMG), lambda k, x: gg.conv_2d(k, x, (2, 1), (1, 0), (1, 2)),
                _conv2d(IMG, KER, (2, 1), (1, 0), (1, 2)), T_MATMUL),
    "pool_2d max": ((IMG[:, :, :8],), lambda a: gg.pool_2d(a, 2),
                    IMG[:, :, :8].reshape(2, 3, 4, 2, 4, 2).max((3, 5)), 0),
    "pool_2d avg": ((IMG[:, :, :8],), lambda a: gg.pool_2d(a, 2, op="avg"),
                    IMG[:, :, :8].reshape(2, 3, 4, 2, 4, 2).mean((3, 5)), T_DEFAULT),
    "flash_attn_ext": ((Q, K, V, KQ_MASK_PADDED), lambda q, k, v, m: gg.flash_attn_ext(q, k, v, m, 0.25),
                       _attention(Q, K, V, KQ_MASK, 0.25), T_MATMUL),
    "argsort": ((X,), gg.argsort, np.argsort(X, -1), 0),
    "argsort descending": ((X,), lambda a: gg.argsort(a, descending=True), np.argsort(-X, -1), 0),
    "top_k": ((X,), lambda a: gg.top_k(a, 3), np.sort(X, -1)[..., -3:], 0),   # values, see below
    "cumsum": ((X,), gg.cumsum, np.cumsum(X, -1), T_DEFAULT),
}


# cases a pinned release refuses (its CPU kernel would abort): op -> (release, what arrived)
SINCE = {"conv_1d": ("0.20.2", "conv_1d with an f32 kernel"),
         "cumsum": ("0.10.1", "ggml_cumsum")}


@pytest.mark.parametrize("op", list(OPS))
def test_op_matches_numpy(dev, op):
    inputs, build, ref, threshold = OPS[op]
    older = op in SINCE and RELEASE < tuple(int(p) for p in SINCE[op][0].split("."))
    with dev.backend() as be, gg.Context() as ctx:
        ts = [ctx.from_numpy(x) for x in inputs]
        ctx.alloc(be)
        for t, x in zip(ts, inputs):
            t.set(np.ascontiguousarray(x))
        if older:                  # refused, cleanly, and said why
            with pytest.raises((gg.InvalidType, gg.UnsupportedError),
                               match=SINCE[op][0].replace(".", r"\.")):
                build(*ts)
            pytest.skip(f"{SINCE[op][1]} arrived in ggml {SINCE[op][0]} (this build is "
                        f"{gg.ggml_version()}, which refuses it)")
        out = build(*ts)
        if dev.type != "cpu" and dev.registry.name != "RPC" and not be.supports_op(out):
            pytest.skip(f"{dev.name} does not support this case (as test-backend-ops reports)")
        be.compute(gg.Graph(out))
        got = out.numpy(copy=True)
    if op == "top_k":       # indices in no particular order: compare the values they pick
        got = np.sort(np.take_along_axis(X, got, -1), -1)
    assert got.shape == ref.shape
    if threshold == 0:
        assert np.array_equal(got, ref)
    else:
        assert nmse(got, ref) < threshold



# case: (exception, message pattern, build). Each pattern names the check that must refuse.
BAD = {
    "add shapes": (gg.InvalidArgument, "do not broadcast", lambda c: c["a"] + c["c"]),
    "gg.add shapes": (gg.InvalidArgument, "does not repeat into", lambda c: gg.add(c["a"], c["c"])),
    "gg.add strided a": (gg.InvalidArgument, "rows of a .* are strided", lambda c: gg.add(c["sq"].T, c["sq"])),
    "gg.add ints": (gg.InvalidType, "needs float tensors", lambda c: gg.add(c["i"], c["i"])),
    "gg.add mixed types": (gg.InvalidType, "mixed types f32 and f16", lambda c: gg.add(c["a"], c["h"])),
    "sub of an f16 by ints": (gg.InvalidType, "needs float tensors", lambda c: c["h"] - c["i"]),
    "mul_mat inner": (gg.InvalidArgument, "inner dims differ", lambda c: gg.mul_mat(c["a"], c["c"])),
    "mul_mat batch": (gg.InvalidArgument, "batch dims", lambda c: gg.mul_mat(c["img"], c["sq4"])),
    "matmul shapes": (gg.InvalidArgument, "not aligned", lambda c: c["a"] @ c["a"]),
    "concat shapes": (gg.InvalidArgument, "differ off axis", lambda c: gg.concat(c["a"], c["c"], axis=0)),
    "concat types": (gg.InvalidType, "types differ", lambda c: gg.concat(c["a"], c["h"], axis=0)),
    "reshape count": (gg.InvalidArgument, "cannot reshape", lambda c: c["a"].reshape((5, 5))),
    "gg.reshape non-contiguous": (gg.InvalidArgument, "must be contiguous", lambda c: gg.reshape(c["a"].T, (32,))),
    "reshape float shape": (gg.InvalidType, "must be an int", lambda c: c["a"].reshape((4.0, 8))),
    "view past end": (gg.InvalidArgument, "runs past", lambda c: c["a"].view((4, 8), offset=8)),
    "mul_mat transposed a": (gg.InvalidArgument, "must not be transposed", lambda c: gg.mul_mat(c["sq"].T, c["sq"])),
    "unary on int": (gg.InvalidType, "needs float tensors", lambda c: gg.relu(c["i"])),
    "unary strided": (gg.InvalidArgument, "strided", lambda c: gg.relu(c["sq"].T)),
    "get_rows float index": (gg.InvalidType, "indices must be i32", lambda c: gg.get_rows(c["a"], c["a"])),
    "permute axes": (gg.InvalidArgument, "not a permutation", lambda c: c["a"].permute((0, 0))),
    "closed context": (gg.ClosedError, "context is closed", lambda c: c["z"] + c["z"]),
    "not a tensor": (gg.InvalidType, "b must be a Tensor", lambda c: gg.add(c["a"], 1.0)),
    "softmax mask shape": (gg.InvalidArgument, "does not cover", lambda c: gg.soft_max(c["a"], mask=c["c"])),
    "softmax max_bias without mask": (gg.InvalidArgument, "max_bias needs a mask", lambda c: gg.soft_max(c["a"], max_bias=1.0)),
    "softmax transposed": (gg.InvalidArgument, "must be contiguous", lambda c: gg.soft_max(c["sq"].T)),
    "norm negative eps": (gg.InvalidArgument, "eps must be >= 0", lambda c: gg.norm(c["a"], -1.0)),
    "rms_norm string eps": (gg.InvalidType, "eps must be a number", lambda c: gg.rms_norm(c["a"], "1e-6")),
    "sum_rows transposed": (gg.InvalidArgument, "strided", lambda c: gg.sum_rows(c["sq"].T)),
    "repeat shape": (gg.InvalidArgument, "does not tile", lambda c: gg.repeat(c["a"], (5, 8))),
    "compute unallocated": (gg.InvalidArgument, "has no memory", lambda c: c["be"].compute(gg.Graph(c["u"] + c["u"]))),
    "compute on wrong device": (gg.InvalidArgument, "cannot use", lambda c: c["rb"].compute(gg.Graph(c["a"] + c["a"]))),
    "scheduler without cpu last": (gg.InvalidArgument, "must be on a CPU", lambda c: gg.Scheduler([c["be"], c["rb"]])),
    "matmul batch shapes": (gg.InvalidArgument, "do not broadcast", lambda c: c["img"] @ c["sq4"]),
    "matmul not aligned": (gg.InvalidArgument, "not aligned", lambda c: c["img"] @ c["heads"]),
    "mul_mat int operand": (gg.InvalidType, "b must be a float", lambda c: gg.mul_mat(c["a"], c["i"])),
    "mul_mat f64 weights": (gg.InvalidType, "a must be f32/f16/bf16", lambda c: gg.mul_mat(c["d"], c["a"])),
    "matmul f64 operand": (gg.InvalidType, "takes float tensors", lambda c: c["a"] @ c["d"].T),
    "cpy element count": (gg.InvalidArgument, "elements into", lambda c: gg.cpy(c["a"], c["c"])),
    "view negative offset": (gg.InvalidArgument, "runs past", lambda c: c["a"].view((4,), offset=-4)),
    "view float offset": (gg.InvalidType, "offset must be an int", lambda c: c["a"].view((4,), offset=4.0)),
    "argmax of 4-D": (gg.InvalidArgument, "takes a matrix", lambda c: gg.argmax(c["img"])),
    "get_rows index shape": (gg.InvalidArgument, "does not fit", lambda c: gg.get_rows(c["img"], c["pos"])),
    "get_rows batch of tables": (gg.InvalidArgument, "does not fit", lambda c: gg.get_rows(c["tables"], c["idx"])),
    "group_norm groups": (gg.InvalidArgument, "do not split", lambda c: gg.group_norm(c["img"], 3)),
    "rope one position short": (gg.InvalidArgument, "one position per token", lambda c: gg.rope_ext(c["heads"], c["idx"])),
    "rope odd n_dims": (gg.InvalidArgument, "must be even", lambda c: gg.rope_ext(c["heads"], c["pos"], 3)),
    "rope float positions": (gg.InvalidType, "positions must be i32", lambda c: gg.rope_ext(c["heads"], c["a"])),
    "rope unknown mode": (gg.InvalidArgument, "mode must be", lambda c: gg.rope_ext(c["heads"], c["pos"], mode=1)),
    "set_rows float indices": (gg.InvalidType, "indices must be i32 or i64", lambda c: gg.set_rows(c["sq"], c["sq"], c["sq"])),
    "set_rows index count": (gg.InvalidArgument, "indices for 4 rows", lambda c: gg.set_rows(c["sq"], c["a"], c["idx"])),
    "set_rows row width": (gg.InvalidArgument, "do not fit", lambda c: gg.set_rows(c["sq"], c["c"], c["idx"])),
    "argsort of int": (gg.InvalidType, "takes f32", lambda c: gg.argsort(c["i"])),
    "top_k more than a row": (gg.InvalidArgument, "must be in 1..8", lambda c: gg.top_k(c["a"], 9)),
    "top_k float k": (gg.InvalidType, "k must be an int", lambda c: gg.top_k(c["a"], 2.5)),
    "cumsum of f16": (gg.InvalidType, "takes f32", lambda c: gg.cumsum(c["h"])),
    "pad negative": (gg.InvalidArgument, "non-negative", lambda c: gg.pad(c["a"], [-1, 0])),
    "pad axis count": (gg.InvalidArgument, "1 widths for 2 axes", lambda c: gg.pad(c["a"], [1])),
    "conv_2d channels": (gg.InvalidArgument, "input channels", lambda c: gg.conv_2d(c["ker3"], c["img"])),
    "conv_2d kernel too big": (gg.InvalidArgument, "smaller than the kernel", lambda c: gg.conv_2d(c["bigker"], c["img"])),
    "conv_2d zero stride": (gg.InvalidArgument, "must be positive", lambda c: gg.conv_2d(c["ker4"], c["img"], stride=0)),
    "conv_2d float stride": (gg.InvalidType, "stride", lambda c: gg.conv_2d(c["ker4"], c["img"], stride=(1.5, 1))),
    "conv_1d channels": (gg.InvalidArgument, "differ in input channels", lambda c: gg.conv_1d(c["ker1"], c["sig"])),
    "pool_2d kernel too big": (gg.InvalidArgument, "smaller than the kernel", lambda c: gg.pool_2d(c["img"], 9)),
    "pool_2d unknown op": (gg.InvalidArgument, "op must be 'max' or 'avg'", lambda c: gg.pool_2d(c["img"], 2, op="min")),
    "flash_attn head sizes": (gg.InvalidArgument, "head sizes differ", lambda c: gg.flash_attn_ext(c["q"], c["kbad"], c["v"])),
    "flash_attn f32 mask": (gg.InvalidType, "mask must be f16", lambda c: gg.flash_attn_ext(c["q"], c["k"], c["v"], c["m32"])),
    "flash_attn bias without mask": (gg.InvalidArgument, "max_bias needs a mask", lambda c: gg.flash_attn_ext(c["q"], c["k"], c["v"], max_bias=1.0)),
    "empty graph": (gg.InvalidType, "non-empty list", lambda c: gg.Graph([])),
    "graph of a non-tensor": (gg.InvalidType, "non-empty list", lambda c: gg.Graph([1.0])),
    "graph capacity too small": (gg.InvalidArgument, "cannot hold", lambda c: gg.Graph(gg.relu(c["a"] + c["a"]), capacity=2)),
    "graph over a closed context": (gg.ClosedError, "context holding tensors", lambda c: c["be"].compute(c["zg"])),
    "tensor float shape": (gg.InvalidType, "must be an int", lambda c: c["ctx"].tensor(gg.f32, (2.5, 3))),
    "tensor string shape": (gg.InvalidType, "must be an int", lambda c: c["ctx"].tensor(gg.f32, "12")),
    "tensor name with NUL": (gg.InvalidArgument, "NUL", lambda c: c["ctx"].tensor(gg.f32, 4, "a\0b")),
    "tensor too big": (gg.OutOfMemory, "more elements than ggml can address", lambda c: c["ctx"].tensor(gg.f32, (1 << 40, 1 << 22))),
    "tensor too many bytes": (gg.OutOfMemory, "bytes, more than", lambda c: c["ctx"].tensor(gg.f64, (1 << 29, 1 << 30))),
    "scalar op on int": (gg.InvalidType, "ggml's kernels compute", lambda c: c["i"] * 2.0),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_graph_input_raises(cpu, rpc_devs, case):
    be, rb = cpu.backend(), rpc_devs[0].backend()
    ctx, uctx, zctx = gg.Context(), gg.Context(), gg.Context()
    c = dict(be=be, rb=rb, a=ctx.tensor(gg.f32, (4, 8)), c=ctx.tensor(gg.f32, (3, 5)),
             h=ctx.tensor(gg.f16, (4, 8)), sq=ctx.tensor(gg.f32, (8, 8)),
             i=ctx.tensor(gg.i32, (4, 8)), u=uctx.tensor(gg.f32, (4,)), z=zctx.tensor(gg.f32, (8,)),
             d=ctx.tensor(gg.f64, (4, 8)),
             img=ctx.tensor(gg.f32, (1, 4, 8, 8)), heads=ctx.tensor(gg.f32, (1, 6, 2, 8)),
             pos=ctx.tensor(gg.i32, (6,)), idx=ctx.tensor(gg.i32, (3,)),
             ker3=ctx.tensor(gg.f32, (2, 3, 3, 3)), ker4=ctx.tensor(gg.f32, (2, 4, 3, 3)),
             bigker=ctx.tensor(gg.f32, (2, 4, 9, 9)), ker1=ctx.tensor(gg.f32, (2, 3, 3)),
             sig=ctx.tensor(gg.f32, (1, 4, 10)), q=ctx.tensor(gg.f32, (1, 2, 3, 8)),
             k=ctx.tensor(gg.f16, (1, 2, 5, 8)), kbad=ctx.tensor(gg.f16, (1, 2, 5, 4)),
             v=ctx.tensor(gg.f16, (1, 2, 5, 8)), m32=ctx.tensor(gg.f32, (3, 5)),
             sq4=ctx.tensor(gg.f32, (3, 8, 8)), tables=ctx.tensor(gg.f32, (2, 1, 6, 8)), ctx=ctx)
    ctx.alloc(be)
    c["zg"] = gg.Graph(c["a"] + c["z"])     # a graph with a leaf in zctx, closed next
    zctx.close()
    exc, pattern, make = BAD[case]
    with pytest.raises(exc, match=pattern):
        make(c)
    out = c["a"] + c["a"]                       # the process and the objects still work
    c["a"].set(np.ones((4, 8), np.float32))
    be.compute(gg.Graph(out))
    assert out.numpy()[0, 0] == 2
    ctx.close(); uctx.close(); be.close(); rb.close()


@pytest.mark.parametrize("bad", [6, -1, 1 << 40])
@pytest.mark.parametrize("dev_kind", ["CPU", "RPC0"])
def test_row_indices_are_range_checked_at_compute(rpc_devs, dev_kind, bad):
    """ggml asserts on an index out of range (an RPC server dies of it): each compute checks
    the index inputs' values first, the boundary included."""
    dev = gg.device("CPU") if dev_kind == "CPU" else rpc_devs[0]
    with dev.backend() as be, gg.Context() as ctx:
        table = ctx.from_numpy(np.arange(48, dtype=np.float32).reshape(6, 8))
        idx = ctx.from_numpy(np.array([0, 5], np.int64 if bad > 2 ** 31 else np.int32))
        dst = ctx.from_numpy(np.zeros((6, 8), np.float32))
        src = ctx.from_numpy(np.ones((2, 8), np.float32))
        ctx.alloc(be)
        g1, g2 = gg.Graph(gg.get_rows(table, idx)) if bad < 2 ** 31 else None, gg.Graph(gg.set_rows(dst, src, idx))
        for g in (g1, g2):
            if g is None:
                continue
            be.compute(g)                                  # in range: fine
            idx.set(np.array([0, bad], idx.dtype))
            with pytest.raises(gg.InvalidArgument, match=f"index {bad} is out of range for 6 rows"):
                be.compute(g)
            idx.set(np.array([0, 5], idx.dtype))


def test_flash_attn_mask_rows_follow_the_release():
    """ggml before 0.10 asserts that the mask has its query rows padded to GGML_KQ_MASK_PAD
    (64); later releases read the first Nq rows. An unpadded mask is refused with that reason
    where the release pads, and computes where it does not."""
    from ggml_py.ops.nn import _KQ_MASK_PAD
    with gg.device("CPU").backend() as be, gg.Context() as ctx:
        q, k, v, m = (ctx.from_numpy(a) for a in (Q, K, V, KQ_MASK))    # 5 mask rows, 5 queries
        if _KQ_MASK_PAD > 1:
            with pytest.raises(gg.InvalidArgument, match="GGML_KQ_MASK_PAD"):
                gg.flash_attn_ext(q, k, v, m, 0.25)
            return
        out = gg.flash_attn_ext(q, k, v, m, 0.25)
        ctx.alloc(be)
        for t, x in zip((q, k, v, m), (Q, K, V, KQ_MASK)):
            t.set(np.ascontiguousarray(x))
        be.compute(gg.Graph(out))
        assert nmse(out.numpy(copy=True), _attention(Q, K, V, KQ_MASK, 0.25)) < T_MATMUL


def test_the_release_each_optional_function_arrived_in():
    """`need` names the release that added a function: that table agrees with every pinned
    tree fetched here (a tree declares the function exactly when it is that release or newer)."""
    from ggml_build import pins
    from ggml_py.ops._common import ADDED
    root = Path(__file__).resolve().parents[2] / "vendor"
    trees = [(r, root / r / "include") for r in pins.load_manifest()[1]]
    trees = [(r, inc) for r, inc in trees if inc.is_dir()]
    if not trees:
        pytest.skip("no pinned tree fetched")
    for fn, release in ADDED.items():
        for r, inc in trees:
            declared = any(re.search(rf"\b{fn}\(", h.read_text()) for h in inc.glob("*.h"))
            assert declared == (pins._version_key(r) >= pins._version_key(release)), (fn, r)
