"""CUDA measurements, each against its baselines in the same run (for the GPU machine):

  1. mul_mat N x N x N for N in 4096 and 8192, for operand pairs (weights x activations)
     f16 x f32, f16 x f16, bf16 x bf16 and f32 x f32: ggml_py vs torch.matmul of the same
     types (f16 x f32 against torch's f16 x f16), and vs upstream's test-backend-ops `perf`
     where it was built (build_ggml.py --with-tests), fed the same shapes through --test-file:
     TFLOP/s and ratios. ggml's CUDA f32 mul_mat runs on tensor cores at reduced precision,
     so its f32 row is also set against torch with TF32 allowed;
  2. device-to-device copy_async (two backends of CUDA0) vs torch's copy of the same bytes;
  3. Python-side cost of one compute of a small graph (100 tiny adds) vs the native program.

    python benchmarks/bench_cuda.py [--device CUDA0] [--sizes 4096,8192]
        [--pairs f16xf32,f16xf16,bf16xbf16,f32xf32] [--only matmul]
"""
import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import ggml_py as gg
from _common import run_native
from bench_graph import compute_py


def tflops(n, seconds):
    return 2 * n ** 3 / seconds / 1e12


BYTES = {"f32": 4, "f16": 2, "bf16": 2}


def operand(x, type_name):
    """`x` (float32) as the host array a tensor of `type_name` takes: numpy's own dtype, or
    raw bytes for bf16 (the high half of each float32, rounded to nearest even)."""
    if type_name == "bf16":
        bits = x.view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).view(np.uint8)
    return x.astype({"f32": np.float32, "f16": np.float16}[type_name])


def ggml_py_matmul(dev, n, wtype, btype, reps):
    rng = np.random.default_rng(0)
    with dev.backend() as be, gg.Context() as ctx:
        a = ctx.tensor(gg.TYPES[wtype], (n, n))
        b = ctx.tensor(gg.TYPES[btype], (n, n))
        ctx.alloc(be)
        a.set(operand(rng.standard_normal((n, n), dtype=np.float32), wtype))
        b.set(operand(rng.standard_normal((n, n), dtype=np.float32), btype))
        g = gg.Graph(gg.mul_mat(a, b))
        be.compute(g)
        t = time.perf_counter()
        for _ in range(reps):
            be.compute_async(g)
        be.synchronize()
        return (time.perf_counter() - t) / reps


def perf_matmul(exe, dev, n, wtype, btype):
    """us per run from test-backend-ops perf for the same mul_mat (a test-file case)."""
    op = int(gg.lib.GGML_OP_MUL_MAT)
    f32 = int(gg.lib.GGML_TYPE_F32)

    def src(t):
        ts = BYTES[t]
        return f"{int(gg.TYPES[t])} {n} {n} 1 1 {ts} {ts * n} {ts * n * n} {ts * n * n}"
    # op type ne0..3 n_params n_src [type ne0..3 nb0..3]... name
    line = f"{op} {f32} {n} {n} 1 1 0 2 {src(wtype)} {src(btype)} -\n"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(line)
    out = subprocess.run([str(exe), "perf", "-b", dev, "--test-file", f.name],
                         capture_output=True, text=True, timeout=300).stdout
    m = re.search(r"([\d.]+) us/run", out)
    return float(m.group(1)) * 1e-6 if m else None


def torch_matmul(n, wtype, reps, tf32=False):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = tf32
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[wtype]
    a = torch.randn(n, n, device="cuda", dtype=dt)
    b = torch.randn(n, n, device="cuda", dtype=dt)
    torch.matmul(a, b)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def copy_bandwidth(dev, nbytes, reps):
    with dev.backend() as b0, dev.backend() as b1, gg.Context() as ctx:
        a = ctx.tensor(gg.i8, (nbytes,))
        c = ctx.tensor(gg.i8, (nbytes,))
        ctx.alloc(b0)
        gg.copy_async(a, c, b0, b1)
        b1.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            gg.copy_async(a, c, b0, b1)
        b1.synchronize()
        ours = (time.perf_counter() - t) / reps
    import torch
    x = torch.empty(nbytes, dtype=torch.int8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    torch.cuda.synchronize()
    theirs = (time.perf_counter() - t) / reps
    gb = nbytes / 1e9
    print(f"copy_async {dev.name}->{dev.name} {nbytes >> 20} MiB: ggml_py {gb / ours:.0f} GB/s, "
          f"torch copy_ {gb / theirs:.0f} GB/s ({theirs / ours:.2f}x of torch's speed)")


def small_graph(dev, nodes, reps):
    pb, _, _ = compute_py(dev, "chain", nodes, reps)
    nb, _ = run_native(gg.BUILD_DIR, dev.name, "chain", nodes, reps, 1)
    print(f"compute of a {nodes}-add graph on {dev.name}: ggml_py {pb * 1e6:.1f} us, native "
          f"{nb * 1e6:.1f} us: {pb / nb:.3f}x, Python-side cost {(pb - nb) * 1e6:.1f} us per compute")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="CUDA0")
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--pairs", default="f16xf32,f16xf16,bf16xbf16,f32xf32",
                    help="weights x activations types of the mul_mat rows")
    ap.add_argument("--only", choices=("matmul",), help="skip the copy and small-graph rows")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    dev = gg.device(args.device)
    exe = gg.BUILD_DIR / "bin" / "test-backend-ops"
    print(f"ggml {gg.ggml_version()} on {dev.name} ({dev.description}); "
          f"test-backend-ops: {'yes' if exe.exists() else 'not built (--with-tests)'}")
    for n in (int(s) for s in args.sizes.split(",")):
        for pair in args.pairs.split(","):
            wtype, btype = pair.split("x")
            ours = ggml_py_matmul(dev, n, wtype, btype, args.reps)
            perf = perf_matmul(exe, dev.name, n, wtype, btype) if exe.exists() else None
            torch_t = torch_matmul(n, wtype, args.reps)
            line = (f"mul_mat {wtype} x {btype} {n}^3: ggml_py {tflops(n, ours):.1f} TFLOP/s, "
                    f"torch.matmul ({wtype} x {wtype}) {tflops(n, torch_t):.1f} "
                    f"({torch_t / ours:.2f}x of torch's speed)")
            if wtype == "f32":
                tf = torch_matmul(n, wtype, args.reps, tf32=True)
                line += f", torch TF32 {tflops(n, tf):.1f} ({tf / ours:.2f}x)"
            if perf:
                line += f", test-backend-ops {tflops(n, perf):.1f} ({perf / ours:.3f}x of native's speed)"
            print(line, flush=True)
    if args.only == "matmul":
        return
    copy_bandwidth(dev, 1 << 30, args.reps)
    small_graph(dev, 100, 200)


if __name__ == "__main__":
    main()
