"""Tensor parallelism through ggml's meta device (issue 34), each figure against its baseline
in the same run:

  --rpc   two local RPC servers: an MLP stack split column-then-row over both (meta device)
          against the same stack on one RPC server and on the local CPU: time per layer, and
          the bytes each layer's all-reduce moves (its PARTIAL output, f32);
  --cuda  N virtual CUDA devices of one GPU (GGML_CUDA_DEVICES=N; N parts): a 16-layer f16
          MLP of width 8192 split over CUDA0..CUDA{N-1} against the same stack on CUDA0 alone.
          With one physical GPU this measures the meta backend's overhead (the goal: <= 1.10x).

Each prints which all-reduce the meta backend has (the parts' registry's
ggml_backend_comm_allreduce_tensor, or ggml's generic fallback). --cuda also separates the
all-reduce from the compute, in the same run:

  - the stack with allreduce='backend' (CUDA's comm: for two devices without NCCL, ggml's
    internal all-reduce, which stages through pinned host memory) and with 'generic' (the
    meta backend's butterfly of device copies and adds; the default on virtual devices);
  - "no all-reduce": each layer's column-parallel half alone (relu(W1 x), W1 split on its
    output rows, outputs left split), against the same graph on one device.

    python benchmarks/bench_meta.py --rpc [--layers 4 --width 512 --tokens 32]
    GGML_CUDA_DEVICES=2 python benchmarks/bench_meta.py --cuda [--layers 16 --width 8192]
"""
import argparse
import os
import sys
import time

import numpy as np

import ggml_py as gg
from _common import best


def stack(ws, x, layers):
    """x + W2 relu(W1 x) per layer (residual): one all-reduce per layer on a meta device."""
    for i in range(layers):
        h = gg.relu(gg.mul_mat(ws[f"w1_{i}"], x))
        x = gg.add(x, gg.mul_mat(ws[f"w2_{i}"], h))
    return x


def split_for(layers):
    out = {}
    for i in range(layers):
        out[f"w1_{i}"] = gg.Split(axis=0)     # columns: each part computes a slice of h
        out[f"w2_{i}"] = gg.Split(axis=1)     # rows: each part a partial sum of the output
    return out


def timed(be, layers, width, tokens, dtype, w1, w2, x0, repeat):
    with gg.Context() as ctx:
        ws = {}
        for i in range(layers):
            ws[f"w1_{i}"] = ctx.tensor(dtype, (width, width), f"w1_{i}")
            ws[f"w2_{i}"] = ctx.tensor(dtype, (width, width), f"w2_{i}")
        x = ctx.tensor(gg.f32, (tokens, width), "x")
        t0 = time.perf_counter()
        ctx.alloc(be)
        for i in range(layers):
            ws[f"w1_{i}"].set(w1)
            ws[f"w2_{i}"].set(w2)
        x.set(x0)
        t_set = time.perf_counter() - t0
        y = stack(ws, x, layers)
        g = gg.Graph(y)
        def once():             # compute, then read the output: RPC's compute returns before
            be.compute(g)       # the server is done, a read waits for it
            y.numpy(copy=True)
        sec = best(once, repeat=repeat, warmup=2)
        return sec, y.numpy(copy=True), t_set


def timed_columns(be, layers, width, tokens, dtype, w1, x0, repeat):
    """relu(W1_i x) for every layer, all graph outputs, nothing reduced: the split matmuls'
    compute without an all-reduce (read back: one output)."""
    with gg.Context() as ctx:
        ws = [ctx.tensor(dtype, (width, width), f"w1_{i}") for i in range(layers)]
        x = ctx.tensor(gg.f32, (tokens, width), "x")
        ctx.alloc(be)
        for w in ws:
            w.set(w1)
        x.set(x0)
        hs = [gg.relu(gg.mul_mat(w, x)) for w in ws]
        g = gg.Graph(hs)
        def once():
            be.compute(g)
            be.synchronize()
        return best(once, repeat=repeat, warmup=2)


def columns_split(layers):
    return {f"w1_{i}": gg.Split(axis=0) for i in range(layers)}


def nmse(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b * b), 1e-30))


def report(name, sec, base, layers, extra=""):
    print(f"{name:34} {sec * 1e3:9.3f} ms  {sec / layers * 1e6:9.1f} us/layer  "
          f"{sec / base:5.2f}x{extra}", flush=True)


def run_rpc(args):
    servers = [gg.rpc.serve() for _ in range(2)]
    devs = [gg.rpc.connect(s.endpoint).devices[0] for s in servers]
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((args.width, args.width)) / np.sqrt(args.width)).astype(np.float32)
    w2 = (rng.standard_normal((args.width, args.width)) / np.sqrt(args.width)).astype(np.float32)
    x0 = rng.standard_normal((args.tokens, args.width)).astype(np.float32)
    md = gg.meta_device(devs, split_for(args.layers))
    print(f"# {args.layers} layers, width {args.width}, {args.tokens} tokens, f32; "
          f"meta {md.name} over {[d.name for d in devs]}, allreduce: {md.allreduce}")
    with gg.device("CPU").backend() as be:
        cpu, ref, _ = timed(be, args.layers, args.width, args.tokens, gg.f32, w1, w2, x0,
                            args.repeat)
    with devs[0].backend() as be:
        one, _, _ = timed(be, args.layers, args.width, args.tokens, gg.f32, w1, w2, x0,
                          args.repeat)
    with md.backend() as be:
        meta, got, _ = timed(be, args.layers, args.width, args.tokens, gg.f32, w1, w2, x0,
                             args.repeat)
    report("local CPU (baseline)", cpu, cpu, args.layers)
    report(f"one RPC server ({devs[0].name})", one, cpu, args.layers)
    report(f"meta over 2 RPC servers", meta, cpu, args.layers,
           f"  ({meta / one:.2f}x one server; NMSE {nmse(got, ref):.1e})")
    print(f"bytes per all-reduce: {args.tokens * args.width * 4} (a {args.tokens}x{args.width} "
          f"f32 partial sum, once per layer; {args.layers} per compute)")
    for s in servers:
        s.close()


def run_cuda(args):
    n = int(os.environ.get("GGML_CUDA_DEVICES", "0") or 0)
    cuda = [d for d in gg.devices() if d.name.startswith("CUDA")]
    if len(cuda) < 2:
        print(f"needs >= 2 CUDA devices (GGML_CUDA_DEVICES=2); found {[d.name for d in cuda]}")
        return 1
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((args.width, args.width)) / np.sqrt(args.width)).astype(np.float16)
    w2 = (rng.standard_normal((args.width, args.width)) / np.sqrt(args.width)).astype(np.float16)
    x0 = rng.standard_normal((args.tokens, args.width)).astype(np.float32)
    md = gg.meta_device(cuda, split_for(args.layers), allreduce="backend")
    auto = gg.meta_device(cuda, split_for(args.layers))
    print(f"# {args.layers} layers f16 {args.width}x{args.width}, {args.tokens} tokens; "
          f"GGML_CUDA_DEVICES={n}; meta over {[d.name for d in cuda]} "
          f"({cuda[0].description}; PCI {sorted({str(d.device_id) for d in cuda})}); "
          f"allreduce='backend': {md.allreduce}; the default ('auto'): {auto.allreduce}",
          flush=True)
    flop = 2 * 2 * args.width * args.width * args.tokens * args.layers
    with cuda[0].backend() as be:
        one, ref, t1 = timed(be, args.layers, args.width, args.tokens, gg.f16, w1, w2, x0,
                             args.repeat)
    with md.backend() as be:
        meta, got, t2 = timed(be, args.layers, args.width, args.tokens, gg.f16, w1, w2, x0,
                              args.repeat)
    report(f"{cuda[0].name} alone (baseline)", one, one, args.layers,
           f"  {flop / one / 1e12:.0f} TFLOP/s")
    report(f"meta over {len(cuda)}, allreduce='backend'", meta, one, args.layers,
           f"  {flop / meta / 1e12:.0f} TFLOP/s; NMSE vs one device {nmse(got, ref):.1e}; "
           f"{md.allreduce}")
    if args.variants:
        gen = gg.meta_device(cuda, split_for(args.layers), allreduce="generic")
        with gen.backend() as be:
            fly, got2, _ = timed(be, args.layers, args.width, args.tokens, gg.f16, w1, w2,
                                 x0, args.repeat)
        report(f"meta over {len(cuda)}, allreduce='generic'", fly, one, args.layers,
               f"  {flop / fly / 1e12:.0f} TFLOP/s; NMSE {nmse(got2, ref):.1e} (butterfly)")
        with cuda[0].backend() as be:
            c1 = timed_columns(be, args.layers, args.width, args.tokens, gg.f16, w1, x0,
                               args.repeat)
        mc = gg.meta_device(cuda, columns_split(args.layers))
        with mc.backend() as be:
            cm = timed_columns(be, args.layers, args.width, args.tokens, gg.f16, w1, x0,
                               args.repeat)
        report("no all-reduce: one device", c1, c1, args.layers, "  (relu(W1 x) per layer)")
        report(f"no all-reduce: meta over {len(cuda)}", cm, c1, args.layers)
    print(f"weights set: {t1:.2f} s on one device, {t2:.2f} s split; bytes per all-reduce: "
          f"{args.tokens * args.width * 4}")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rpc", action="store_true")
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--width", type=int)
    ap.add_argument("--tokens", type=int)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-variants", dest="variants", action="store_false",
                    help="--cuda: only the stack on one device and on the meta device")
    a = ap.parse_args()
    if a.cuda:
        a.layers, a.width, a.tokens = a.layers or 16, a.width or 8192, a.tokens or 512
        return run_cuda(a)
    a.layers, a.width, a.tokens = a.layers or 4, a.width or 512, a.tokens or 32
    run_rpc(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
