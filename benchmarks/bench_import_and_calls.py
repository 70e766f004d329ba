"""Import time of ggml_py vs numpy, and a raw binding call vs ctypes on the same library.

    python benchmarks/bench_import_and_calls.py

The fresh processes import with bytecode caches, as Python does by default and as a pip
install leaves them: PYTHONDONTWRITEBYTECODE is dropped from their environment and a first
process writes the caches. Without caches every module of the package is compiled from source
at each import (about 30 ms more on the development machine; that once read as the import's
own cost).
"""
import ctypes
import os
import statistics
import subprocess
import sys
import timeit


def import_time(statement: str, runs: int = 15) -> float:
    """Median wall time of `statement` in fresh processes."""
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  env=env, check=True).stdout) for _ in range(runs)]
    return statistics.median(times)


def main():
    np_t = import_time("import numpy")
    gg_t = import_time("import ggml_py")
    use_t = import_time("import ggml_py as gg; gg.Tensor")
    np_use_t = import_time("import numpy, ggml_py as gg; gg.Tensor")
    print(f"import numpy                       {np_t * 1e3:7.1f} ms")
    print(f"import ggml_py                     {gg_t * 1e3:7.1f} ms  ({(gg_t - np_t) * 1e3:+.1f} ms "
          "vs numpy; the face is lazy: it finds the build and stops)")
    print(f"import ggml_py, first use          {use_t * 1e3:7.1f} ms  ({(use_t - np_t) * 1e3:+.1f} ms "
          "vs numpy; loads numpy, the library and the core)")
    print(f"import numpy + ggml_py, first use  {np_use_t * 1e3:7.1f} ms  "
          f"(ggml_py's own share {(np_use_t - np_t) * 1e3:+.1f} ms)")

    import ggml_py as gg
    ctx = gg.Context()
    t = ctx.tensor(gg.f32, (64, 64))
    raw = t.ptr
    n = 1_000_000
    cffi_t = min(timeit.repeat(lambda: gg.lib.ggml_nelements(raw), number=n, repeat=5)) / n
    base = ctypes.CDLL(str(gg.BUILD_DIR / "libggml-base.so"))
    fn = base.ggml_nelements
    fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_void_p]
    addr = ctypes.c_void_p(int(gg.ffi.cast("uintptr_t", raw)))
    ct_t = min(timeit.repeat(lambda: fn(addr), number=n, repeat=5)) / n
    print(f"ggml_nelements  cffi {cffi_t * 1e9:6.1f} ns   ctypes {ct_t * 1e9:6.1f} ns   "
          f"({cffi_t / ct_t:.2f}x ctypes)")
    ctx.close()


if __name__ == "__main__":
    main()
