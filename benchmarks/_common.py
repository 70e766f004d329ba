"""Shared by the benchmark scripts: timing, and the native baseline program."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def best(fn, repeat: int = 5, warmup: int = 1) -> float:
    """Fastest of `repeat` timed calls of `fn` (seconds), after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def ordered_copy(src, dst, src_backend, dst_backend) -> None:
    """copy_async ordered after `src_backend`'s queued work: an event recorded on the source,
    waited on by the destination (where the copy is queued). Synchronize `dst_backend` to read."""
    import ggml_py as gg
    with src_backend.device.event() as ev:
        ev.record(src_backend)
        dst_backend.wait(ev)
        gg.copy_async(src, dst, src_backend, dst_backend)


def native_program(build_dir: Path) -> Path:
    """benchmarks/native_graph.c compiled against the libraries of `build_dir` (cached)."""
    info = json.loads((build_dir / "build.json").read_text())
    include = Path(info["inputs"]["tree"]) / "include"
    exe = Path(tempfile.gettempdir()) / f"ggml_py-native_graph-{build_dir.name}"
    src = HERE / "native_graph.c"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-O2", str(src), f"-I{include}", f"-L{build_dir}", "-lggml",
                        "-lggml-base", f"-Wl,-rpath,{build_dir}", "-o", str(exe)], check=True)
    return exe


def run_native(build_dir: Path, device: str, test: str, size: int, reps: int, threads: int,
               wtype: str = "f32") -> tuple[float, float]:
    """(best, mean) seconds per compute of the native program."""
    out = subprocess.run([str(native_program(build_dir)), device, test, str(size), str(reps),
                          str(threads), wtype], check=True, capture_output=True, text=True)
    b, m = out.stdout.split()
    return float(b), float(m)
