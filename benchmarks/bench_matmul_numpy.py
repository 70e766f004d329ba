"""A 1024^3 f32 matmul on the CPU backend against numpy's, in one run (issue 12, point 7).

    python benchmarks/bench_matmul_numpy.py [--size 1024] [--threads 2]

ggml's CPU backend is built with llamafile's sgemm kernels on, as llama.cpp ships it (ggml's
standalone default is off). numpy runs with the same number of threads (threadpoolctl when
installed, else OPENBLAS_NUM_THREADS set before numpy is imported). On machines where
OPENBLAS_CORETYPE is set for old-OpenBLAS safety, unset it together with OPENBLAS_L2_SIZE for
this run to measure a current numpy at full speed; the script prints which kernel numpy uses.
"""
from __future__ import annotations

import argparse
import os
import sys

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--size", type=int, default=1024)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--repeat", type=int, default=10)
args = p.parse_args()
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import best  # noqa: E402

import ggml_py as gg  # noqa: E402

n = args.size
rng = np.random.default_rng(0)
A = rng.standard_normal((n, n), dtype=np.float32)
B = rng.standard_normal((n, n), dtype=np.float32)

with gg.device("CPU").backend(n_threads=args.threads) as be, gg.Context() as ctx:
    a, b = ctx.from_numpy(A), ctx.from_numpy(B)
    ctx.alloc(be)
    a.set(A)
    b.set(B)
    c = a @ b
    g = gg.Graph(c)
    be.compute(g)
    err = float(np.sum((c.numpy() - A @ B) ** 2) / np.sum((A @ B) ** 2))
    t_ggml = best(lambda: be.compute(g), repeat=args.repeat)
t_np = best(lambda: A @ B, repeat=args.repeat)

try:
    from threadpoolctl import threadpool_info
    kernel = ", ".join(f"{i.get('internal_api')} {i.get('architecture', '')}".strip()
                       for i in threadpool_info())
except ImportError:
    kernel = "unknown (pip install threadpoolctl to see)"
flops = 2 * n ** 3
print(f"matmul {n}^3 f32, {args.threads} threads, best of {args.repeat}")
print(f"  ggml {gg.ggml_version()} CPU: {t_ggml * 1e3:8.2f} ms  {flops / t_ggml / 1e9:6.1f} GFLOP/s"
      f"  (NMSE vs numpy {err:.1e}; llamafile "
      f"{gg.BUILD['inputs']['cmake'].get('GGML_LLAMAFILE', 'OFF')})")
print(f"  numpy {np.__version__}:   {t_np * 1e3:8.2f} ms  {flops / t_np / 1e9:6.1f} GFLOP/s  ({kernel};"
      f" OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')})")
print(f"  ratio ggml / numpy: {t_ggml / t_np:.2f}x")
