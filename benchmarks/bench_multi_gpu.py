"""Two GPUs (issues 7 and 17; needs CUDA0 and CUDA1), each against its baseline in the same run:

  1. copy_async CUDA0 -> CUDA1, ordered by an event, vs torch's copy of the same bytes:
     x.to("cuda:1") where torch sees two GPUs; with one physical GPU split into virtual devices
     (GGML_CUDA_DEVICES=2) torch sees one, and the baseline is a cuda:0 -> cuda:0 copy_;
  2. a stack of matmul + tanh layers on one GPU, split in two halves over both GPUs by the
     scheduler (a 2-stage pipeline), and alternating between them layer by layer: the time
     each extra split costs, against one GPU.

    python benchmarks/bench_multi_gpu.py [--mib 1024] [--layers 16] [--width 8192]
    GGML_CUDA_DEVICES=2 python benchmarks/bench_multi_gpu.py     # one physical GPU
"""
import argparse
import time

import numpy as np

import ggml_py as gg
from _common import ordered_copy


def peer_copy(d0, d1, nbytes, reps):
    with d0.backend() as b0, d1.backend() as b1, gg.Context() as c0, gg.Context() as c1:
        a = c0.tensor(gg.i8, (nbytes,))
        c0.alloc(b0)
        dst = c1.tensor(gg.i8, (nbytes,))
        c1.alloc(b1)

        ordered_copy(a, dst, b0, b1)
        b1.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            ordered_copy(a, dst, b0, b1)
        b1.synchronize()
        ours = (time.perf_counter() - t) / reps
    import torch
    x = torch.empty(nbytes, dtype=torch.int8, device="cuda:0")
    if torch.cuda.device_count() > 1:
        what, y = "x.to('cuda:1')", torch.empty_like(x, device="cuda:1")
    else:   # virtual devices on one GPU: torch sees one
        what, y = "cuda:0 -> cuda:0 copy_", torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize(y.device)
    t = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    torch.cuda.synchronize(y.device)
    theirs = (time.perf_counter() - t) / reps
    gb = nbytes / 1e9
    print(f"copy_async {d0.name}->{d1.name} {nbytes >> 20} MiB: ggml_py {gb / ours:.0f} GB/s, "
          f"torch {what} {gb / theirs:.0f} GB/s ({theirs / ours:.2f}x of torch's speed)")


def pipeline(d0, d1, cpu, layers, width, reps):
    rng = np.random.default_rng(0)
    w = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float16)
         for _ in range(layers)]
    x = rng.standard_normal((512, width)).astype(np.float32)
    times = {}
    home = {"one GPU": lambda i: 0, "two halves": lambda i: int(i >= layers // 2),
            "alternating": lambda i: i % 2}
    for mode, side in home.items():
        b0, b1, bc = d0.backend(), d1.backend(), cpu.backend()
        ctx0, ctx1 = gg.Context(), gg.Context()
        homes = [(ctx0, ctx1)[side(i)] for i in range(layers)]
        ws = [c.from_numpy(wi) for c, wi in zip(homes, w)]
        xin = ctx0.from_numpy(x)
        ctx0.alloc(b0)
        if mode != "one GPU":
            ctx1.alloc(b1)
        for t, wi in zip(ws, w):
            t.set(wi)
        xin.set(x)
        h = xin
        for t in ws:
            h = gg.tanh(gg.mul_mat(t, h))
        with gg.Scheduler([b0, b1, bc]) as sched:
            g = gg.Graph(h)
            sched.compute(g)
            t0 = time.perf_counter()
            for _ in range(reps):
                sched.compute(g)
            times[mode] = ((time.perf_counter() - t0) / reps, sched.n_splits, sched.n_copies)
        ctx0.close()
        ctx1.close()
        for b in (b0, b1, bc):
            b.close()
    t1, s1, _ = times["one GPU"]
    print(f"{layers} layers of {width}x{width} f16 weights, {512}x{width} f32 activations: "
          f"one GPU {t1 * 1e3:.2f} ms ({s1} splits)")
    for mode in ("two halves", "alternating"):
        t2, s2, c2 = times[mode]
        extra = f", {(t2 - t1) / (s2 - s1) * 1e6:+.0f} us per extra split" if s2 > s1 else ""
        print(f"  {d0.name}+{d1.name}, {mode}: {t2 * 1e3:.2f} ms ({s2} splits, {c2} copies): "
              f"{t1 / t2:.2f}x of one GPU's speed{extra}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    d0, d1 = gg.device("CUDA0"), gg.device("CUDA1")
    print(f"ggml {gg.ggml_version()}: {d0.description} + {d1.description}")
    peer_copy(d0, d1, args.mib << 20, args.reps)
    pipeline(d0, d1, gg.device("CPU"), args.layers, args.width, args.reps)


if __name__ == "__main__":
    main()
