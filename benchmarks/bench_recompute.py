"""Recompute of a small graph against the same loop in C, in many alternating rounds.

    python benchmarks/bench_recompute.py [--device CUDA0] [--nodes 100] [--rounds 10]
        [--reps 1000]

A graph of 100 adds computes in tens of microseconds, so one round's best is mostly the
device's launch jitter: bench_graph.py's three rounds read anywhere from 1.0x to 1.3x on the
H200 from one run to the next. Here ours (`be.compute(g)` on one gg.Graph) and
benchmarks/native_graph.c (`ggml_backend_graph_compute` on one graph) take turns for
`rounds` rounds of `reps` computes each; the figures are the median over rounds of each
round's best and mean, and their ratios. Within each round the raw binding's call
(lib.ggml_backend_graph_compute on the same graph, from this process) alternates with ours
compute by compute: what is ggml_py's own, apart from what running in a Python process
costs.
"""
import argparse
import statistics
import time

import ggml_py as gg
from ggml_py import lib
from _common import run_native
from bench_graph import chain_graph


def ours_and_raw(dev, nodes, reps):
    """(best, mean) seconds of `be.compute(g)` and of lib.ggml_backend_graph_compute on the
    same graph from this process: the second is the cost of the call without ggml_py."""
    with dev.backend() as be, gg.Context() as ctx:
        g = chain_graph(be, ctx, nodes)
        for _ in range(2):
            be.compute(g)
        raw_be, raw_g, compute = be.ptr, g.ptr, lib.ggml_backend_graph_compute
        ours, raw = [], []
        for _ in range(reps):
            t = time.perf_counter()
            be.compute(g)
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            compute(raw_be, raw_g)
            raw.append(time.perf_counter() - t)
        threads = be.n_threads or 1
    return (min(ours), sum(ours) / reps), (min(raw), sum(raw) / reps), threads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=1000)
    args = ap.parse_args()
    dev = gg.device(args.device)
    ours, raw, native = [], [], []
    for _ in range(args.rounds):
        o, r, threads = ours_and_raw(dev, args.nodes, args.reps)
        ours.append(o)
        raw.append(r)
        native.append(run_native(gg.BUILD_DIR, dev.name, "chain", args.nodes, args.reps, threads))
    ob, om = (statistics.median(x[i] for x in ours) for i in (0, 1))
    rb, rm = (statistics.median(x[i] for x in raw) for i in (0, 1))
    nb, nm = (statistics.median(x[i] for x in native) for i in (0, 1))
    per_round = sorted(o[0] / n[0] for o, n in zip(ours, native))
    print(f"ggml {gg.ggml_version()} on {dev.name}: recompute of a {args.nodes}-add chain, "
          f"{args.rounds} rounds of {args.reps}, alternating")
    print(f"  ggml_py best {ob * 1e6:.1f} us, mean {om * 1e6:.1f} us; C loop best "
          f"{nb * 1e6:.1f} us, mean {nm * 1e6:.1f} us: {ob / nb:.3f}x best, {om / nm:.3f}x mean "
          f"(medians over rounds)")
    print(f"  the raw call from this process (lib.ggml_backend_graph_compute, the same graph, "
          f"alternating with ours): best {rb * 1e6:.1f} us, mean {rm * 1e6:.1f} us; ggml_py is "
          f"{ob / rb:.3f}x best, {om / rm:.3f}x mean of it")
    print(f"  per-round ratio of bests: min {per_round[0]:.3f}, median "
          f"{statistics.median(per_round):.3f}, max {per_round[-1]:.3f}")


if __name__ == "__main__":
    main()
