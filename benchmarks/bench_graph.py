"""Graph building and compute through ggml_py against baselines measured in the same run.

  1. building a chain of 10,000 adds (the Pythonic API, t = t + y, vs the raw cffi binding,
     lib.ggml_add in a loop, per node; also at 1,000, 100,000 and 1,000,000 nodes) and a
     transformer-like graph of 32 layers (ggml_py's ggml-level ops vs the same calls through raw cffi), each
     also through the ctypes peer when it is installed;
  2. computing a 1024x1024x1024 f32 matmul and a 10,000-node elementwise chain through
     ggml_py vs benchmarks/native_graph.c running the same graph on the same libraries.

    python benchmarks/bench_graph.py [--device CPU] [--size 1024] [--nodes 10000]

The ctypes peer, ggml-python 0.0.45 (hand-written ctypes over a ggml of its own, built at
install time: `pip install ggml-python==0.0.45`, or `--target DIR` and GGML_PY_PEER_PATH=DIR),
builds the same chain in a child process of this run when it is installed (its libggml and
ours stay in separate processes).
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

import ggml_py as gg
from ggml_py import ffi, lib
from _common import best, run_native

# best of REPS builds, on each side (ours, raw cffi, the peer in its child process): the first
# builds in a process fault in fresh pages for the records (about 2 us a page here), and the
# C allocator hands later ones fresh pages again now and then; seven reach each side's
# steady state
REPS = 7


def build_pythonic(n):
    with gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (4096,))
        y = ctx.tensor(gg.f32, (4096,))
        t0 = time.perf_counter()
        t = x
        for _ in range(n):
            t = t + y
        return time.perf_counter() - t0


PEER = """
import time, ggml
n, best = {n}, float("inf")
for _ in range({reps}):
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=ggml.ggml_tensor_overhead() * (n + 8),
                                               mem_buffer=None, no_alloc=True))
    x = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4096)   # (as build_raw's)
    y = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4096)
    t0 = time.perf_counter()
    t = x
    for _ in range(n):
        t = ggml.ggml_add(ctx, t, y)
    best = min(best, time.perf_counter() - t0)
    ggml.ggml_free(ctx)
print(best)
"""


def build_peer(n):
    """The chain built through the ctypes peer (ggml-python 0.0.45) in a child process; None
    when the peer is not installed."""
    return _peer(PEER.format(n=n, reps=REPS))


def _peer(script):
    """The float a script printed, run with the ctypes peer importable; None without it."""
    extra = os.environ.get("GGML_PY_PEER_PATH")
    env = dict(os.environ)
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True,
                       text=True, env=env, cwd="/")
    return float(r.stdout) if r.returncode == 0 else None


def build_raw(n):
    p = ffi.new("struct ggml_init_params *", {"mem_size": int(lib.ggml_tensor_overhead()) * (n + 8),
                                              "mem_buffer": ffi.NULL, "no_alloc": True})
    ctx = lib.ggml_init(p[0])
    try:
        x = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 4096)
        y = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 4096)
        t0 = time.perf_counter()
        t = x
        for _ in range(n):
            t = lib.ggml_add(ctx, t, y)
        return time.perf_counter() - t0
    finally:
        lib.ggml_free(ctx)


# a transformer-like layer (llama's shape: norms, attention with rope and a mask, a gated
# MLP), 30 ggml tensors per layer; E model width, H heads of D, T tokens, F MLP width
E, H, D, T, F = 256, 4, 64, 8, 512
WEIGHTS = [(E,), (E, E), (E, E), (E, E), (E, E), (E,), (F, E), (F, E), (E, F)]   # numpy order


def transformer_pythonic(layers):
    """(seconds, tensors built) for `layers` layers through ggml_py's ggml-level ops."""
    with gg.Context() as ctx:
        ws = [[ctx.tensor(gg.f32, s) for s in WEIGHTS] for _ in range(layers)]
        x = ctx.tensor(gg.f32, (T, E))
        pos = ctx.tensor(gg.i32, (T,))
        mask = ctx.tensor(gg.f32, (T, T))
        before = ctx.n_tensors()
        t0 = time.perf_counter()
        for an, wq, wk, wv, wo, fn, w1, w3, w2 in ws:
            h = gg.mul(gg.rms_norm(x, 1e-5), an)
            q = gg.reshape(gg.mul_mat(wq, h), (T, H, D))
            k = gg.reshape(gg.mul_mat(wk, h), (T, H, D))
            v = gg.reshape(gg.mul_mat(wv, h), (T, H, D))
            q = gg.permute(gg.rope_ext(q, pos), (1, 0, 2))
            k = gg.permute(gg.rope_ext(k, pos), (1, 0, 2))
            kq = gg.soft_max(gg.mul_mat(k, q), mask, 0.125)
            vt = gg.cont(gg.permute(v, (1, 2, 0)))
            kqv = gg.cont(gg.permute(gg.mul_mat(vt, kq), (1, 0, 2)))
            x = gg.add(gg.mul_mat(wo, gg.reshape(kqv, (T, E))), x)
            h = gg.mul(gg.rms_norm(x, 1e-5), fn)
            g = gg.silu(gg.mul_mat(w1, h))
            x = gg.add(gg.mul_mat(w2, gg.mul(g, gg.mul_mat(w3, h))), x)
        return time.perf_counter() - t0, ctx.n_tensors() - before


# the same layers through raw bindings: `L` is the module of ggml functions (our cffi lib, or
# the peer's ctypes module), `N` its NULL
TRANSFORMER_RAW = """
def transformer_raw(L, N, F32, I32, layers, tensor_overhead):
    import time
    E, H, D, T, F = {E}, {H}, {D}, {T}, {F}
    ctx = L.ggml_init(L.ggml_init_params(mem_size=tensor_overhead * (layers * 48 + 64),
                                         mem_buffer=N, no_alloc=True)) if hasattr(
        L, "ggml_init_params") else L.ggml_init(PARAMS(tensor_overhead * (layers * 48 + 64)))
    t1 = lambda a: L.ggml_new_tensor_1d(ctx, F32, a)
    t2 = lambda a, b: L.ggml_new_tensor_2d(ctx, F32, a, b)
    ws = [[t1(E), t2(E, E), t2(E, E), t2(E, E), t2(E, E), t1(E), t2(E, F), t2(E, F), t2(F, E)]
          for _ in range(layers)]
    x, pos, mask = t2(E, T), L.ggml_new_tensor_1d(ctx, I32, T), t2(T, T)
    t0 = time.perf_counter()
    for an, wq, wk, wv, wo, fn, w1, w3, w2 in ws:
        h = L.ggml_mul(ctx, L.ggml_rms_norm(ctx, x, 1e-5), an)
        q = L.ggml_reshape_3d(ctx, L.ggml_mul_mat(ctx, wq, h), D, H, T)
        k = L.ggml_reshape_3d(ctx, L.ggml_mul_mat(ctx, wk, h), D, H, T)
        v = L.ggml_reshape_3d(ctx, L.ggml_mul_mat(ctx, wv, h), D, H, T)
        q = L.ggml_permute(ctx, L.ggml_rope_ext(ctx, q, pos, N, D, 0, 0, 10000.0, 1.0, 0.0, 1.0,
                                                32.0, 1.0), 0, 2, 1, 3)
        k = L.ggml_permute(ctx, L.ggml_rope_ext(ctx, k, pos, N, D, 0, 0, 10000.0, 1.0, 0.0, 1.0,
                                                32.0, 1.0), 0, 2, 1, 3)
        kq = L.ggml_soft_max_ext(ctx, L.ggml_mul_mat(ctx, k, q), mask, 0.125, 0.0)
        vt = L.ggml_cont(ctx, L.ggml_permute(ctx, v, 1, 2, 0, 3))
        kqv = L.ggml_cont(ctx, L.ggml_permute(ctx, L.ggml_mul_mat(ctx, vt, kq), 0, 2, 1, 3))
        x = L.ggml_add(ctx, L.ggml_mul_mat(ctx, wo, L.ggml_reshape_2d(ctx, kqv, E, T)), x)
        h = L.ggml_mul(ctx, L.ggml_rms_norm(ctx, x, 1e-5), fn)
        g = L.ggml_silu(ctx, L.ggml_mul_mat(ctx, w1, h))
        x = L.ggml_add(ctx, L.ggml_mul_mat(ctx, w2, L.ggml_mul(ctx, g, L.ggml_mul_mat(ctx, w3, h))), x)
    dt = time.perf_counter() - t0
    L.ggml_free(ctx)
    return dt
""".format(E=E, H=H, D=D, T=T, F=F)

PEER_TRANSFORMER = TRANSFORMER_RAW + """
import ggml
print(min(transformer_raw(ggml, None, ggml.GGML_TYPE_F32, ggml.GGML_TYPE_I32, {layers},
                          ggml.ggml_tensor_overhead()) for _ in range({reps})))
"""


def transformer_raw(layers):
    ns = {"PARAMS": lambda size: ffi.new("struct ggml_init_params *", {
        "mem_size": size, "mem_buffer": ffi.NULL, "no_alloc": True})[0]}
    exec(TRANSFORMER_RAW, ns)
    return ns["transformer_raw"](lib, ffi.NULL, lib.GGML_TYPE_F32, lib.GGML_TYPE_I32, layers,
                                 int(lib.ggml_tensor_overhead()))


def transformer_peer(layers):
    """The same layers through the ctypes peer, in a child process; None when not installed."""
    return _peer(PEER_TRANSFORMER.replace("{layers}", str(layers)).replace("{reps}", str(REPS)))


def build_and_graph_pythonic(n):
    """Chain of n adds plus gg.Graph (what a user pays before the first compute)."""
    with gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (4096,))
        y = ctx.tensor(gg.f32, (4096,))
        t0 = time.perf_counter()
        t = x
        for _ in range(n):
            t = t + y
        gg.Graph(t)
        return time.perf_counter() - t0


def build_and_graph_raw(n):
    p = ffi.new("struct ggml_init_params *", {"mem_size": int(lib.ggml_tensor_overhead()) * (n + 8)
                                              + int(lib.ggml_graph_overhead_custom(2 * n + 16, False)),
                                              "mem_buffer": ffi.NULL, "no_alloc": True})
    ctx = lib.ggml_init(p[0])
    try:
        x = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 4096)
        y = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 4096)
        t0 = time.perf_counter()
        t = x
        for _ in range(n):
            t = lib.ggml_add(ctx, t, y)
        g = lib.ggml_new_graph_custom(ctx, 2 * n + 16, False)
        lib.ggml_build_forward_expand(g, t)
        return time.perf_counter() - t0
    finally:
        lib.ggml_free(ctx)


def first_compute_pythonic(be, n):
    with gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (64,))
        y = ctx.tensor(gg.f32, (64,))
        ctx.alloc(be)
        t = x
        for _ in range(n):
            t = t + y
        g = gg.Graph(t)
        t0 = time.perf_counter()
        be.compute(g)
        return time.perf_counter() - t0


def first_compute_raw(be, n):
    """gallocr + compute of the same graph through the raw bindings."""
    p = ffi.new("struct ggml_init_params *", {"mem_size": int(lib.ggml_tensor_overhead()) * (n + 8)
                                              + int(lib.ggml_graph_overhead_custom(2 * n + 16, False)),
                                              "mem_buffer": ffi.NULL, "no_alloc": True})
    ctx = lib.ggml_init(p[0])
    try:
        x = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 64)
        y = lib.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 64)
        buf = lib.ggml_backend_alloc_ctx_tensors(ctx, be.ptr)
        t = x
        for _ in range(n):
            t = lib.ggml_add(ctx, t, y)
        g = lib.ggml_new_graph_custom(ctx, 2 * n + 16, False)
        lib.ggml_build_forward_expand(g, t)
        t0 = time.perf_counter()
        galloc = lib.ggml_gallocr_new(lib.ggml_backend_get_default_buffer_type(be.ptr))
        lib.ggml_gallocr_alloc_graph(galloc, g)
        lib.ggml_backend_graph_compute(be.ptr, g)
        dt = time.perf_counter() - t0
        lib.ggml_gallocr_free(galloc)
        lib.ggml_backend_buffer_free(buf)
        return dt
    finally:
        lib.ggml_free(ctx)


def mlp_pythonic(be, iters, same_graph=False):
    """Tiny MLP (8x64 -> 64 -> 8): set the input, compute, read the output, per iteration.

    `same_graph`: the raw loop's graph, weights stored as ggml wants them (each row a column of
    the numpy weight) and gg.mul_mat; otherwise numpy-semantics `@`, which transposes and
    copies each (64, n) weight at every compute (7 nodes, not 3)."""
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((8, 64), dtype=np.float32)
    w1, w2 = (rng.standard_normal(s, dtype=np.float32) for s in ((64, 64), (64, 8)))
    with gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (8, 64))
        if same_graph:
            w1t, w2t = ctx.from_numpy(w1.T.copy()), ctx.from_numpy(w2.T.copy())
            ctx.alloc(be)
            out = gg.mul_mat(w2t, gg.tanh(gg.mul_mat(w1t, x)))
        else:
            w1g, w2g = ctx.from_numpy(w1), ctx.from_numpy(w2)
            ctx.alloc(be)
            out = gg.tanh(x @ w1g) @ w2g
        g = gg.Graph(out)
        res = np.empty((8, 8), np.float32)
        x.set(x_np)
        be.compute(g)
        t0 = time.perf_counter()
        for _ in range(iters):
            x.set(x_np)
            be.compute(g)
            be.get(out, res)
        return (time.perf_counter() - t0) / iters


def mlp_raw(be, iters):
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((8, 64), dtype=np.float32)
    p = ffi.new("struct ggml_init_params *", {"mem_size": 1 << 20, "mem_buffer": ffi.NULL,
                                              "no_alloc": True})
    ctx = lib.ggml_init(p[0])
    x = lib.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_F32, 64, 8)
    w1t = lib.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_F32, 64, 64)     # stored transposed
    w2t = lib.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_F32, 64, 8)
    buf = lib.ggml_backend_alloc_ctx_tensors(ctx, be.ptr)
    w1 = rng.standard_normal((64, 64), dtype=np.float32).T.copy()
    w2 = rng.standard_normal((64, 8), dtype=np.float32).T.copy()
    lib.ggml_backend_tensor_set(w1t, ffi.from_buffer(w1), 0, w1.nbytes)
    lib.ggml_backend_tensor_set(w2t, ffi.from_buffer(w2), 0, w2.nbytes)
    out = lib.ggml_mul_mat(ctx, w2t, lib.ggml_tanh(ctx, lib.ggml_mul_mat(ctx, w1t, x)))
    g = lib.ggml_new_graph(ctx)
    lib.ggml_build_forward_expand(g, out)
    galloc = lib.ggml_gallocr_new(lib.ggml_backend_get_default_buffer_type(be.ptr))
    lib.ggml_gallocr_alloc_graph(galloc, g)
    res = np.empty((8, 8), np.float32)
    xb, rb = ffi.from_buffer(x_np), ffi.from_buffer(res)
    t0 = time.perf_counter()
    for _ in range(iters):
        lib.ggml_backend_tensor_set(x, ffi.from_buffer(x_np), 0, x_np.nbytes)
        lib.ggml_backend_graph_compute(be.ptr, g)
        lib.ggml_backend_tensor_get(out, ffi.from_buffer(res), 0, res.nbytes)
    dt = (time.perf_counter() - t0) / iters
    del xb, rb
    lib.ggml_gallocr_free(galloc)
    lib.ggml_backend_buffer_free(buf)
    lib.ggml_free(ctx)
    return dt


def chain_graph(be, ctx, size):
    """The graph of `size` adds on 4096 floats, its inputs allocated on `be` and set (as
    native_graph.c's chain)."""
    x = ctx.tensor(gg.f32, (4096,))
    y = ctx.tensor(gg.f32, (4096,))
    ctx.alloc(be)
    x.set(np.ones(4096, np.float32))
    y.set(np.ones(4096, np.float32))
    out = x
    for _ in range(size):
        out = out + y
    return gg.Graph(out)


def compute_py(dev, test, size, reps, wtype="f32"):
    rng = np.random.default_rng(0)
    with dev.backend() as be, gg.Context() as ctx:
        if test == "matmul":
            a = ctx.tensor(gg.TYPES[wtype], (size, size))
            b = ctx.tensor(gg.f32, (size, size))
            ctx.alloc(be)
            a.set(rng.standard_normal((size, size), dtype=np.float32).astype(a.dtype or np.float32))
            b.set(rng.standard_normal((size, size), dtype=np.float32))
            out = gg.mul_mat(a, b)
            g = gg.Graph(out)
        else:
            g = chain_graph(be, ctx, size)
        for _ in range(2):
            be.compute(g)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            be.compute(g)
            times.append(time.perf_counter() - t)
        threads = be.n_threads or 1
    return min(times), sum(times) / len(times), threads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    dev = gg.device(args.device)
    print(f"ggml {gg.ggml_version()} on {dev.name} ({dev.description})")

    n = args.nodes
    py = min(build_pythonic(n) for _ in range(REPS))
    raw = min(build_raw(n) for _ in range(REPS))
    print(f"build {n} adds: ggml_py {py / n * 1e6:.2f} us/node, raw cffi {raw / n * 1e6:.2f} us/node "
          f"({py / raw:.2f}x)")
    peer = build_peer(n)
    if peer is None:
        print("  ctypes peer (ggml-python 0.0.45): not installed; pip install ggml-python==0.0.45")
    else:
        print(f"  ctypes peer (ggml-python 0.0.45, child process): {peer / n * 1e6:.2f} us/node; "
              f"ggml_py is {py / peer:.2f}x the peer")

    layers = 32
    runs = [transformer_pythonic(layers) for _ in range(REPS)]
    py, nodes = min(r[0] for r in runs), runs[0][1]
    raw = min(transformer_raw(layers) for _ in range(REPS))
    peer = transformer_peer(layers)
    print(f"build a transformer-like graph ({layers} layers, {nodes // layers} tensors each): "
          f"ggml_py {py / nodes * 1e6:.2f} us/node, raw cffi {raw / nodes * 1e6:.2f} us/node "
          f"({py / raw:.2f}x)")
    if peer is None:
        print("  ctypes peer (ggml-python 0.0.45): not installed")
    else:
        print(f"  ctypes peer (ggml-python 0.0.45, child process): {peer / nodes * 1e6:.2f} "
              f"us/node; ggml_py is {py / peer:.2f}x the peer")
    for big in (1000, 100_000, 1_000_000):   # per-node cost against the size of the graph
        reps = 3 if big <= 100_000 else 2        # (a million records: 370 MB a build)
        per = min(build_pythonic(big) for _ in range(reps)) / big
        raw_per = min(build_raw(big) for _ in range(reps)) / big
        print(f"  build {big} adds: ggml_py {per * 1e6:.2f} us/node, raw cffi "
              f"{raw_per * 1e6:.2f} us/node ({per / raw_per:.2f}x)")

    py = min(build_and_graph_pythonic(n) for _ in range(3))
    raw = min(build_and_graph_raw(n) for _ in range(3))
    print(f"build {n} adds + graph: ggml_py {py / n * 1e6:.2f} us/node, raw cffi "
          f"{raw / n * 1e6:.2f} us/node ({py / raw:.2f}x)")
    one = {"n_threads": 1} if dev.type == "cpu" else {}   # GPU backends have no thread count
    with dev.backend(**one) as be:
        # alternated, best of 5 each: run three in a row, the raw loop reused the memory its
        # previous run had just freed (2 ms for 10,000 nodes, against 4 ms interleaved), so
        # the order of the runs, not the code, made half of the ratio
        pys, raws = [], []
        for _ in range(5):
            pys.append(first_compute_pythonic(be, n))
            raws.append(first_compute_raw(be, n))
        py, raw = min(pys), min(raws)
    print(f"first compute of {n} small adds (1 thread): ggml_py {py / n * 1e6:.2f} us/node, raw "
          f"gallocr + compute {raw / n * 1e6:.2f} us/node ({py / raw:.2f}x)")
    with dev.backend(**one) as be:
        py = min(mlp_pythonic(be, 2000) for _ in range(3))
        same = min(mlp_pythonic(be, 2000, same_graph=True) for _ in range(3))
        raw = min(mlp_raw(be, 2000) for _ in range(3))
        xs = np.random.default_rng(0).standard_normal((8, 64), dtype=np.float32)
        w1 = np.random.default_rng(1).standard_normal((64, 64), dtype=np.float32)
        w2 = np.random.default_rng(2).standard_normal((64, 8), dtype=np.float32)
        t0 = time.perf_counter()
        for _ in range(2000):
            np.tanh(xs @ w1) @ w2
        npt = (time.perf_counter() - t0) / 2000
    print(f"tiny MLP iteration (set, compute, get; 1 thread): ggml_py, same graph as the raw "
          f"loop (gg.mul_mat, 3 nodes) {same * 1e6:.1f} us; raw cffi {raw * 1e6:.1f} us "
          f"({same / raw:.2f}x); ggml_py with numpy-semantics @ (7 nodes: the weights "
          f"transposed and copied each time) {py * 1e6:.1f} us ({py / raw:.2f}x); numpy "
          f"{npt * 1e6:.1f} us")
    with gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (4, 8))
        reps = 200_000
        t0 = time.perf_counter()
        for _ in range(reps):
            t.shape
        shape = (time.perf_counter() - t0) / reps
        p = t.ptr
        t0 = time.perf_counter()
        for _ in range(reps):
            lib.ggml_nelements(p)
        nel = (time.perf_counter() - t0) / reps
    print(f"t.shape {shape * 1e9:.0f} ns vs raw lib.ggml_nelements {nel * 1e9:.0f} ns "
          f"({shape / nel:.2f}x)")

    for test, size in (("matmul", args.size), ("chain", n), ("chain", 100)):
        # a graph that computes in tens of microseconds: its best of 10 is the launch jitter's,
        # so it gets 300 computes a round, three rounds, ours and the C loop in turn
        reps, rounds = (300, 3) if test == "chain" and size <= 1000 else (args.reps, 1)
        pb = pm = nb = nm = float("inf")
        for _ in range(rounds):
            b, m, threads = compute_py(dev, test, size, reps)
            pb, pm = min(pb, b), min(pm, m)
            b, m = run_native(gg.BUILD_DIR, dev.name, test, size, reps, threads)
            nb, nm = min(nb, b), min(nm, m)
        what = f"{size}^3 f32 matmul" if test == "matmul" else f"{size}-node add chain"
        extra = f", {2 * size ** 3 / pb / 1e9:.1f} GFLOP/s" if test == "matmul" else ""
        print(f"compute {what}: ggml_py {pb * 1e3:.3f} ms (mean {pm * 1e3:.3f}), native "
              f"{nb * 1e3:.3f} ms (mean {nm * 1e3:.3f}): {pb / nb:.3f}x best, {pm / nm:.3f}x mean"
              f"{extra}")


if __name__ == "__main__":
    main()
