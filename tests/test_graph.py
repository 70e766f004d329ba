"""Tensors, ops and graphs computed on every device, checked against numpy with
test-backend-ops' NMSE thresholds; the scheduler splitting a graph over CPU and two RPC devices."""
import numpy as np
import pytest

import ggml_py as gg
from conftest import LayerStack, nmse

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
    "flash_attn_ext": ((Q, K, V, KQ_MASK), lambda q, k, v, m: gg.flash_attn_ext(q, k, v, m, 0.25),
                       _attention(Q, K, V, KQ_MASK, 0.25), T_MATMUL),
    "argsort": ((X,), gg.argsort, np.argsort(X, -1), 0),
    "argsort descending": ((X,), lambda a: gg.argsort(a, descending=True), np.argsort(-X, -1), 0),
    "top_k": ((X,), lambda a: gg.top_k(a, 3), np.sort(X, -1)[..., -3:], 0),   # values, see below
    "cumsum": ((X,), gg.cumsum, np.cumsum(X, -1), T_DEFAULT),
}


@pytest.mark.parametrize("op", list(OPS))
def test_op_matches_numpy(dev, op):
    inputs, build, ref, threshold = OPS[op]
    with dev.backend() as be, gg.Context() as ctx:
        ts = [ctx.from_numpy(x) for x in inputs]
        ctx.alloc(be)
        for t, x in zip(ts, inputs):
            t.set(np.ascontiguousarray(x))
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


def test_quantized_roundtrip(cpu):
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    with cpu.backend() as be, gg.Context() as ctx:
        q = ctx.tensor(gg.q8_0, x.shape)
        ctx.alloc(be)
        q.set(x)                      # quantized on the way in with ggml_quantize_chunk
        assert nmse(q.numpy(), x) < 1e-3
        raw, t = gg.quantize(x, gg.q4_0)
        assert t is gg.q4_0 and raw.nbytes == 4 * gg.q4_0.row_size(64)


def test_compute_async_then_synchronize(dev):
    with dev.backend() as be, gg.Context() as ctx:
        a = ctx.from_numpy(X)
        ctx.alloc(be)
        a.set(X)
        out = gg.relu(a)
        be.compute_async(gg.Graph(out))
        be.synchronize()
        assert np.array_equal(out.numpy(copy=True), np.maximum(X, 0))


def test_graph_nodes_leafs_and_dot(cpu):
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 4), "a")
        out = gg.relu(a + a)
        g = gg.Graph(out)
        assert g.n_nodes == 2 and [t.name for t in g.leafs] == ["a"]
        assert "digraph" in g.to_dot()
        svg = g.to_svg()
        assert svg.startswith("<svg") and svg.count("<rect") == g.n_nodes + len(g.leafs)
        assert "RELU" in svg and ">a<" in svg


def test_context_grows_past_its_capacity(cpu):
    with cpu.backend() as be, gg.Context(capacity=16) as ctx:
        a = ctx.from_numpy(np.ones(8, np.float32))
        ctx.alloc(be)
        a.set(np.ones(8, np.float32))
        t = a
        for _ in range(100):
            t = t + a
        be.compute(gg.Graph(t))
        assert t.numpy()[0] == 101


def test_scheduler_splits_across_cpu_and_two_rpc_devices(cpu, rpc_devs, rng):
    bes = [rpc_devs[0].backend(), rpc_devs[1].backend(), cpu.backend()]
    stack = LayerStack(bes, bes[2], rng)          # layer i's weights on backend i
    with gg.Scheduler(bes) as sched:
        sched.compute(gg.Graph(stack.out))
        assert sched.n_splits >= 2
        assert nmse(stack.out.numpy(copy=True), stack.ref) < T_MATMUL
    with pytest.raises(gg.InvalidArgument, match="no memory"):
        stack.out.numpy()  # its memory went with the scheduler: it says so, no dangling read
    stack.close()
    for b in bes:
        b.close()


def test_scheduler_result_equals_cpu_alone(cpu, rpc_devs, rng):
    x = rng.standard_normal((16, 16)).astype(np.float32)
    results = []
    for devs in ([cpu], [rpc_devs[0], rpc_devs[1], cpu]):
        bes = [d.backend() for d in devs]
        with gg.Context() as ctx, gg.Scheduler(bes) as sched:
            a = ctx.from_numpy(x)
            ctx.alloc(bes[-1])
            a.set(x)
            out = gg.soft_max(a @ a) + a
            sched.compute(gg.Graph(out))
            results.append(out.numpy(copy=True))
        for b in bes:
            b.close()
    assert nmse(results[1], results[0]) < 1e-10


BAD = {
    "add shapes": lambda c: c["a"] + c["c"],
    "mul_mat inner": lambda c: gg.mul_mat(c["a"], c["c"]),
    "matmul shapes": lambda c: c["a"] @ c["a"],
    "concat shapes": lambda c: gg.concat(c["a"], c["c"], axis=0),
    "concat types": lambda c: gg.concat(c["a"], c["h"], axis=0),
    "reshape count": lambda c: c["a"].reshape((5, 5)),
    "reshape non-contiguous": lambda c: c["a"].T.reshape((32,)),
    "view past end": lambda c: c["a"].view((4, 8), offset=8),
    "mul_mat transposed a": lambda c: gg.mul_mat(c["sq"].T, c["sq"]),
    "unary on int": lambda c: gg.relu(c["i"]),
    "get_rows float index": lambda c: gg.get_rows(c["a"], c["a"]),
    "permute axes": lambda c: c["a"].permute((0, 0)),
    "closed context": lambda c: c["z"] + c["z"],
    "not a tensor": lambda c: gg.add(c["a"], 1.0),
    "softmax mask shape": lambda c: gg.soft_max(c["a"], mask=c["c"]),
    "repeat shape": lambda c: gg.repeat(c["a"], (5, 8)),
    "compute unallocated": lambda c: c["be"].compute(gg.Graph(c["u"] + c["u"])),
    "compute on wrong device": lambda c: c["rb"].compute(gg.Graph(c["a"] + c["a"])),
    "scheduler without cpu last": lambda c: gg.Scheduler([c["be"], c["rb"]]),
    "matmul batch shapes": lambda c: c["img"] @ c["heads"],
    "mul_mat int operand": lambda c: gg.mul_mat(c["a"], c["i"]),
    "mul_mat f64 weights": lambda c: gg.mul_mat(c["d"], c["a"]),     # ggml's CPU would segfault
    "matmul f64 operand": lambda c: c["a"] @ c["d"].T,
    "cpy element count": lambda c: gg.cpy(c["a"], c["c"]),
    "view negative offset": lambda c: c["a"].view((4,), offset=-4),
    "argmax of 4-D": lambda c: gg.argmax(c["img"]),
    "get_rows index shape": lambda c: gg.get_rows(c["img"], c["pos"]),
    "group_norm groups": lambda c: gg.group_norm(c["img"], 3),
    "rope one position short": lambda c: gg.rope_ext(c["heads"], c["idx"]),
    "rope odd n_dims": lambda c: gg.rope_ext(c["heads"], c["pos"], 3),
    "rope float positions": lambda c: gg.rope_ext(c["heads"], c["a"]),
    "rope unknown mode": lambda c: gg.rope_ext(c["heads"], c["pos"], mode=1),
    "set_rows float indices": lambda c: gg.set_rows(c["sq"], c["sq"], c["sq"]),
    "set_rows row width": lambda c: gg.set_rows(c["sq"], c["a"], c["idx"]),
    "argsort of int": lambda c: gg.argsort(c["i"]),
    "top_k more than a row": lambda c: gg.top_k(c["a"], 9),
    "cumsum of f16": lambda c: gg.cumsum(c["h"]),
    "pad negative": lambda c: gg.pad(c["a"], [-1, 0]),
    "pad axis count": lambda c: gg.pad(c["a"], [1]),
    "conv_2d channels": lambda c: gg.conv_2d(c["ker3"], c["img"]),
    "conv_2d kernel too big": lambda c: gg.conv_2d(c["bigker"], c["img"]),
    "conv_2d zero stride": lambda c: gg.conv_2d(c["ker4"], c["img"], stride=0),
    "conv_1d channels": lambda c: gg.conv_1d(c["ker1"], c["sig"]),
    "pool_2d kernel too big": lambda c: gg.pool_2d(c["img"], 9),
    "pool_2d unknown op": lambda c: gg.pool_2d(c["img"], 2, op="min"),
    "flash_attn head sizes": lambda c: gg.flash_attn_ext(c["q"], c["kbad"], c["v"]),
    "flash_attn f32 mask": lambda c: gg.flash_attn_ext(c["q"], c["k"], c["v"], c["m32"]),
    "flash_attn bias without mask": lambda c: gg.flash_attn_ext(c["q"], c["k"], c["v"], max_bias=1.0),
    "empty graph": lambda c: gg.Graph([]),
    "graph of a non-tensor": lambda c: gg.Graph([1.0]),
    "graph capacity too small": lambda c: gg.Graph(gg.relu(c["a"] + c["a"]), capacity=2),
    "graph over a closed context": lambda c: c["be"].compute(c["zg"]),
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
             v=ctx.tensor(gg.f16, (1, 2, 5, 8)), m32=ctx.tensor(gg.f32, (3, 5)))
    ctx.alloc(be)
    c["zg"] = gg.Graph(c["a"] + c["z"])     # a graph with a leaf in zctx, closed next
    zctx.close()
    with pytest.raises(gg.GGMLError):
        BAD[case](c)
    out = c["a"] + c["a"]                       # the process and the objects still work
    c["a"].set(np.ones((4, 8), np.float32))
    be.compute(gg.Graph(out))
    assert out.numpy()[0, 0] == 2
    ctx.close(); uctx.close(); be.close(); rb.close()


def test_scheduler_reserve_pin_async_and_parallel(cpu, rpc_devs, rng):
    x = rng.standard_normal((16, 16)).astype(np.float32)
    rb, cb = rpc_devs[0].backend(), cpu.backend()
    with gg.Context() as ctx:
        a = ctx.from_numpy(x)
        ctx.alloc(cb)
        a.set(x)
        mid = gg.relu(a @ a)
        out = gg.soft_max(mid) + a
        g = gg.Graph(out)
        with gg.Scheduler([rb, cb]) as sched:
            sched.reserve(g)
            assert sched.buffer_size(cb) > 0
            sched.compute(g)
            assert sched.n_splits == 1 and sched.backend_of(mid) is cb   # all on the CPU
            first = out.numpy(copy=True)
            sched.set_backend(mid, rb)                 # pin one node to the RPC device
            sched.compute_async(g)
            sched.synchronize()
            assert sched.backend_of(mid) is rb             # (ggml may move its neighbours too)
            assert nmse(out.numpy(copy=True), first) < 1e-10
            sched.reset()                              # drops the pin (and the placement)
            sched.set_backend(mid, cb)
            sched.compute(g)
            assert sched.backend_of(mid) is cb
            assert nmse(out.numpy(copy=True), first) < 1e-10
        with gg.Scheduler([rb, cb], parallel=True) as par:
            par.compute(g)
            assert par.n_copies > 1                    # pipeline-parallel copies of the inputs
            assert nmse(out.numpy(copy=True), first) < 1e-10
        # ggml's scheduler rewires split nodes to copies it frees later; the graph comes back
        # whole, so a plain backend can compute it after the schedulers are gone
        cb.compute(g)
        assert nmse(out.numpy(copy=True), first) < 1e-10
        with pytest.raises(gg.InvalidArgument, match="not one of"):
            gg.Scheduler([cb]).set_backend(mid, rb)
    rb.close()
    cb.close()


def test_closing_a_context_before_the_scheduler_is_safe(cpu, rpc_devs, rng):
    """Nodes of one graph live in several contexts (a result goes to its first operand's);
    closing one of them while a scheduler holds the graph must not leave ggml writing or
    reading freed memory."""
    bes = [rpc_devs[0].backend(), cpu.backend()]
    stack = LayerStack(bes, bes[1], rng)
    sched = gg.Scheduler(bes)
    g = gg.Graph(stack.out)
    sched.compute(g)
    stack.ctxs[0].close()                # the RPC weights' context, with nodes of the graph
    with pytest.raises(gg.ClosedError, match="context"):
        sched.compute(g)
    with pytest.raises(gg.ClosedError):
        bes[1].compute(g)
    sched.close()
    stack.close()
    for b in bes:
        b.close()
