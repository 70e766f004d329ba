"""Two GPUs (issue 7; needs CUDA0 and CUDA1), each against its baseline in the same run:

  1. peer copy_async CUDA0 -> CUDA1, ordered by an event, vs torch's x.to("cuda:1");
  2. a stack of matmul + tanh layers split over both GPUs by the scheduler vs on one GPU.

    python benchmarks/bench_multi_gpu.py [--mib 1024] [--layers 16] [--width 8192]
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
    x.to("cuda:1")
    torch.cuda.synchronize("cuda:1")
    t = time.perf_counter()
    for _ in range(reps):
        x.to("cuda:1")
    torch.cuda.synchronize("cuda:1")
    theirs = (time.perf_counter() - t) / reps
    gb = nbytes / 1e9
    print(f"peer copy {d0.name}->{d1.name} {nbytes >> 20} MiB: ggml_py {gb / ours:.0f} GB/s, "
          f"torch .to('cuda:1') {gb / theirs:.0f} GB/s ({theirs / ours:.2f}x of torch's speed)")


def pipeline(d0, d1, cpu, layers, width, reps):
    rng = np.random.default_rng(0)
    w = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float16)
         for _ in range(layers)]
    x = rng.standard_normal((512, width)).astype(np.float32)
    times = {}
    for mode in ("one GPU", "two GPUs"):
        b0, b1, bc = d0.backend(), d1.backend(), cpu.backend()
        ctx0, ctx1 = gg.Context(), gg.Context()
        homes = [ctx0 if mode == "one GPU" or i < layers // 2 else ctx1 for i in range(layers)]
        ws = [c.from_numpy(wi) for c, wi in zip(homes, w)]
        xin = ctx0.from_numpy(x)
        ctx0.alloc(b0)
        if mode == "two GPUs":
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
    (t1, s1, _), (t2, s2, c2) = times["one GPU"], times["two GPUs"]
    print(f"{layers} layers of {width}x{width} f16: one GPU {t1 * 1e3:.2f} ms ({s1} splits), "
          f"two GPUs {t2 * 1e3:.2f} ms ({s2} splits, {c2} copies): {t1 / t2:.2f}x")


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
