"""Phases of a cold `pip install -e .`: a fresh clone of this checkout's HEAD, a fresh venv, an
empty GGML_PY_CACHE; every output line of `pip install -v -e .` is timestamped and the phases
are read from build_ggml.py's lines.

    python benchmarks/bench_install.py [--keep DIR]

Also times, in the same run, the two ways of fetching the pinned archive: `pip download`
(which prepares the carrying package's metadata in its own build environment) and the direct
download through the index's simple API that build_ggml.py now uses.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggml_build import pins  # noqa: E402

# (phase, the line that starts it) in build_ggml.py's order
MARKS = [("download", re.compile(r"^\s*(download |downloaded |direct download)")),
         ("extract", re.compile(r"^\s*extract ")),
         ("configure", re.compile(r"^\s*configure \(cmake\)")),
         ("compile", re.compile(r"^\s*compile \(ninja")),
         ("bindings", re.compile(r"^\s*generating cffi bindings")),
         ("pip after the build", re.compile(r"^\s*done in [\d.]+ s"))]


def timed_lines(cmd, env, cwd) -> list[tuple[float, str]]:
    t0 = time.monotonic()
    out = []
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    for line in proc.stdout:
        out.append((time.monotonic() - t0, line.rstrip("\n")))
    out.append((time.monotonic() - t0, f"<exit {proc.wait()}>"))
    if proc.returncode != 0:
        sys.stdout.write("\n".join(l for _, l in out[-40:]) + "\n")
        raise SystemExit(f"{cmd} failed")
    return out


def phases(lines) -> list[tuple[str, float]]:
    starts = [("pip: build environment + editable metadata", 0.0)]
    seen = set()
    for t, line in lines:
        for name, pat in MARKS:
            if name not in seen and pat.search(line):
                seen.add(name)
                starts.append((name, t))
    starts.sort(key=lambda x: x[1])
    end = lines[-1][0]
    return [(n, (starts[i + 1][1] if i + 1 < len(starts) else end) - t)
            for i, (n, t) in enumerate(starts)]


def fetch_compare(tmp: Path) -> tuple[float, float]:
    pin = pins.pin_for(pins.load_manifest()[0])
    a, b = tmp / "pip", tmp / "direct"
    a.mkdir()
    b.mkdir()
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-cache-dir", "--no-deps",
                    "--no-binary", ":all:", "-q", "-d", str(a), f"{pin.package}=={pin.version}"],
                   check=True, capture_output=True)
    t_pip = time.monotonic() - t
    t = time.monotonic()
    assert pins._direct_download(pin, b) is not None
    t_direct = time.monotonic() - t
    assert pins.sha256_of(a / pin.file) == pins.sha256_of(b / pin.file) == pin.sha256
    return t_pip, t_direct


def main():
    keep = sys.argv[sys.argv.index("--keep") + 1] if "--keep" in sys.argv else None
    tmp = Path(keep or tempfile.mkdtemp(prefix="ggml_py-bench-install-"))
    try:
        src = tmp / "src"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(src)], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GGML_PY", "PYTHON", "VIRTUAL_ENV"))}
        env.update(GGML_PY_CACHE=str(tmp / "sdists"), PIP_NO_CACHE_DIR="1")
        pip = [str(tmp / "venv" / "bin" / "python"), "-m", "pip"]
        lines = timed_lines([*pip, "install", "-v", "-e", "."], env, src)
        total = lines[-1][0]
        print(f"cold `pip install -e .` of {src} (ggml {pins.load_manifest()[0]}, "
              f"{os.cpu_count()} cores): {total:.1f} s")
        for name, dt in phases(lines):
            print(f"  {name:<45} {dt:6.1f} s  {100 * dt / total:4.0f} %")
        t_pip, t_direct = fetch_compare(tmp)
        print(f"fetching the pinned archive: pip download {t_pip:.1f} s, direct {t_direct:.1f} s "
              f"({t_pip / t_direct:.0f}x)")
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
