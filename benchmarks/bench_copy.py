"""copy_async between two backends of one device (ordered by an event, read after the
destination synchronizes) vs a blocking ggml_backend_tensor_copy of the same bytes, in the
same run. For Vulkan0 (lavapipe in CI), CUDA0, MTL0, or RPC devices.

    GGML_PY_BUILD=ggml-0.25.3-cpu-rpc-vulkan python benchmarks/bench_copy.py --device Vulkan0
"""
import argparse
import time

import numpy as np

import ggml_py as gg
from _common import ordered_copy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None, help="default: the first GPU-type device")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    dev = gg.device(args.device) if args.device else gg.device(type="gpu")
    n = args.mib << 20
    x = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8).view(np.int8)
    with dev.backend() as b0, dev.backend() as b1, gg.Context() as ctx:
        a, c = ctx.tensor(gg.i8, (n,)), ctx.tensor(gg.i8, (n,))
        ctx.alloc(b0)
        a.set(x)

        def ordered():
            ordered_copy(a, c, b0, b1)
            b1.synchronize()

        def blocking():
            gg.copy(a, c)

        timings = {}
        for name, fn in (("copy_async", ordered), ("blocking copy", blocking)):
            fn()
            t = time.perf_counter()
            for _ in range(args.reps):
                fn()
            timings[name] = (time.perf_counter() - t) / args.reps
        assert np.array_equal(c.numpy(), x)
    gb = n / 2**30
    (ta, tb) = timings["copy_async"], timings["blocking copy"]
    print(f"{dev.name} -> {dev.name}, {args.mib} MiB: copy_async+event+synchronize "
          f"{gb / ta:.2f} GiB/s, blocking copy {gb / tb:.2f} GiB/s ({tb / ta:.2f}x)")


if __name__ == "__main__":
    main()
