"""Issue 32's two speed debts, each against its baseline in the same run, alternating.

    python benchmarks/bench_surface.py [--mib 64] [--reps 20] [--computes 20000]

1. ``t.numpy(copy=True)`` of a host tensor of `mib` MiB against ``x.copy()`` of a numpy array
   of the same size (goal: within 1.1x).
2. ``be.compute(g)`` of an already-validated 1-add graph on one CPU thread against the raw
   binding's call ``lib.ggml_backend_graph_compute(be.ptr, g.ptr)`` on the same graph, compute
   by compute (goal: within 0.3 us).
Figures: the best (min) and the median of each; ratios and differences of the two.
"""
import argparse
import statistics
import time

import numpy as np

import ggml_py as gg
from ggml_py.raw import lib


def copies(mib: int, reps: int) -> tuple[list[float], list[float]]:
    n = mib * 2**20 // 4
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    ours, base = [], []
    with gg.device("CPU").backend() as be, gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (n,))
        ctx.alloc(be)
        t.set(x)
        for _ in range(reps + 2):
            s = time.perf_counter()
            a = t.numpy(copy=True)
            ours.append(time.perf_counter() - s)
            del a
            s = time.perf_counter()
            b = x.copy()
            base.append(time.perf_counter() - s)
            del b
    return ours[2:], base[2:]


def computes(reps: int) -> tuple[list[float], list[float]]:
    with gg.device("CPU").backend() as be, gg.Context() as ctx:
        be.n_threads = 1
        x = ctx.from_numpy(np.ones(16, np.float32))
        y = ctx.from_numpy(np.ones(16, np.float32))
        ctx.alloc(be)
        g = gg.Graph(x + y)
        be.compute(g)
        be.compute(g)                         # validated: the fast path from here on
        raw_be, raw_g, compute = be.ptr, g.ptr, lib.ggml_backend_graph_compute
        ours, raw = [], []
        pc = time.perf_counter
        for _ in range(reps):
            s = pc()
            be.compute(g)
            ours.append(pc() - s)
            s = pc()
            compute(raw_be, raw_g)
            raw.append(pc() - s)
    return ours, raw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--computes", type=int, default=20000)
    a = ap.parse_args()
    ours, base = copies(a.mib, a.reps)
    ob, bb = min(ours), min(base)
    om, bm = statistics.median(ours), statistics.median(base)
    print(f"ggml {gg.ggml_version()}: t.numpy(copy=True) of {a.mib} MiB vs x.copy(), "
          f"{a.reps} alternating")
    print(f"  ours best {ob * 1e3:.2f} ms, median {om * 1e3:.2f} ms; x.copy() best "
          f"{bb * 1e3:.2f} ms, median {bm * 1e3:.2f} ms: {ob / bb:.3f}x best, {om / bm:.3f}x median")
    ours, raw = computes(a.computes)
    ob, rb = min(ours), min(raw)
    om, rm = statistics.median(ours), statistics.median(raw)
    print(f"be.compute(g) of a validated 1-add graph (1 thread) vs lib.ggml_backend_graph_compute, "
          f"{a.computes} alternating")
    print(f"  ours best {ob * 1e6:.2f} us, median {om * 1e6:.2f} us; raw best {rb * 1e6:.2f} us, "
          f"median {rm * 1e6:.2f} us: +{(ob - rb) * 1e6:.2f} us best, +{(om - rm) * 1e6:.2f} us "
          f"median ({om / rm:.2f}x)")


if __name__ == "__main__":
    main()
