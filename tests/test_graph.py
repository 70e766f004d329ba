"""Tensors, ops and graphs computed on every device, checked against numpy with
test-backend-ops' NMSE thresholds; the scheduler splitting a graph over CPU and two RPC devices."""
import numpy as np
import pytest

import ggml_py as gg
from conftest import nmse

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
        be.compute(gg.Graph(out))
        got = out.numpy(copy=True)
    assert got.shape == ref.shape
    assert nmse(got, ref) < threshold


def test_get_rows(dev):
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    idx = np.array([3, 0, 9], np.int32)
    with dev.backend() as be, gg.Context() as ctx:
        a, i = ctx.from_numpy(table), ctx.from_numpy(idx)
        ctx.alloc(be)
        a.set(table); i.set(idx)
        out = gg.get_rows(a, i)
        be.compute(gg.Graph(out))
        assert np.array_equal(out.numpy(copy=True), table[idx])


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
    x = rng.standard_normal((8, 32)).astype(np.float32)
    w = [rng.standard_normal((32, 32)).astype(np.float32) / 6 for _ in range(3)]
    ref = x
    for wi in w:
        ref = np.tanh(ref @ wi)
    bes = [rpc_devs[0].backend(), rpc_devs[1].backend(), cpu.backend()]
    ctxs = [gg.Context() for _ in bes]
    ws = [c.from_numpy(wi) for c, wi in zip(ctxs, w)]   # layer i's weights on backend i
    xin = ctxs[2].from_numpy(x)
    for c, b in zip(ctxs, bes):
        c.alloc(b)
    for t, wi in zip(ws, w):
        t.set(wi)
    xin.set(x)
    h = xin
    for t in ws:
        h = gg.tanh(h @ t)
    with gg.Scheduler(bes) as sched:
        g = gg.Graph(h)
        sched.compute(g)
        assert sched.n_splits >= 2
        assert nmse(h.numpy(copy=True), ref) < T_MATMUL
    with pytest.raises(gg.InvalidArgument, match="no memory"):
        h.numpy()          # its memory went with the scheduler: it says so, no dangling read
    for c in ctxs:
        c.close()
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
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_graph_input_raises(cpu, rpc_devs, case):
    be, rb = cpu.backend(), rpc_devs[0].backend()
    ctx, uctx, zctx = gg.Context(), gg.Context(), gg.Context()
    c = dict(be=be, rb=rb, a=ctx.tensor(gg.f32, (4, 8)), c=ctx.tensor(gg.f32, (3, 5)),
             h=ctx.tensor(gg.f16, (4, 8)), sq=ctx.tensor(gg.f32, (8, 8)),
             i=ctx.tensor(gg.i32, (4, 8)), u=uctx.tensor(gg.f32, (4,)), z=zctx.tensor(gg.f32, (4,)))
    ctx.alloc(be)
    zctx.close()
    with pytest.raises(gg.GGMLError):
        BAD[case](c)
    out = c["a"] + c["a"]                       # the process and the objects still work
    c["a"].set(np.ones((4, 8), np.float32))
    be.compute(gg.Graph(out))
    assert out.numpy()[0, 0] == 2
    ctx.close(); uctx.close(); be.close(); rb.close()
