"""No-op and (with --cold) cold build times of build_ggml.py.

    python benchmarks/bench_build.py [--cold]
The cold build goes to a temporary --lib-root and its own build folder is removed first.
"""
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "build_ggml.py"), *args], cwd=ROOT, check=True,
                   capture_output=True)
    return time.perf_counter() - t


def main():
    run()
    noop = min(run() for _ in range(3))
    print(f"no-op rebuild   {noop:6.2f} s")
    if "--cold" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            cold = run("--clean", "--lib-root", tmp)
            print(f"cold build      {cold:6.1f} s (CPU + RPC, -j{__import__('os').cpu_count()})")


if __name__ == "__main__":
    main()
