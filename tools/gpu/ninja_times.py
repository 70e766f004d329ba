"""What a build's time went to, from ninja's own log (``.ninja_log``: start and end in ms of
every object ninja ran).

    python tools/gpu/ninja_times.py build/<config>/cmake/.ninja_log [--top 25]

Prints the wall time the log spans, the summed object time (CPU-side; with -jN about N times
the wall time when the build is compile-bound), that sum grouped by source family (CUDA
template instances by kind, other CUDA files, CPU backend, the rest), and the slowest objects.
"""
from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path


def entries(log: Path) -> list[tuple[int, int, str]]:
    """(start_ms, end_ms, output) of the last run of each output (the log appends reruns)."""
    last: dict[str, tuple[int, int, str]] = {}
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) >= 4:
            last[parts[3]] = (int(parts[0]), int(parts[1]), parts[3])
    return sorted(last.values())


FAMILIES = [
    ("cuda fattn-vec instances", r"template-instances/fattn-vec"),
    ("cuda fattn-mma instances", r"template-instances/fattn-mma"),
    ("cuda fattn-tile instances", r"template-instances/fattn-tile"),
    ("cuda mmq instances", r"template-instances/mmq"),
    ("cuda mmf instances", r"template-instances/mmf"),
    ("cuda other .cu", r"ggml-cuda/.*\.cu\.o$"),
    ("vulkan shaders", r"ggml-vulkan|vulkan-shaders"),
    ("cpu backend", r"ggml-cpu/"),
    ("link", r"\.so(\.\d+)*$|/bin/"),
]


def family(out: str) -> str:
    for name, pat in FAMILIES:
        if re.search(pat, out):
            return name
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    rows = entries(args.log)
    if not rows:
        print("empty log")
        return
    wall = (max(e for _, e, _ in rows) - min(s for s, _, _ in rows)) / 1e3
    total = sum(e - s for s, e, _ in rows) / 1e3
    print(f"{len(rows)} outputs; wall span {wall:.1f} s; summed object time {total:.1f} s")
    fam: dict[str, list[float]] = defaultdict(list)
    for s, e, out in rows:
        fam[family(out)].append((e - s) / 1e3)
    print(f"\n{'family':<28} {'objects':>7} {'sum s':>8} {'share':>6} {'max s':>7}")
    for name, ts in sorted(fam.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name:<28} {len(ts):>7} {sum(ts):>8.1f} {sum(ts) / total:>6.1%} {max(ts):>7.1f}")
    print(f"\nslowest {args.top}:")
    for s, e, out in sorted(rows, key=lambda r: r[0] - r[1])[: args.top]:
        print(f"{(e - s) / 1e3:8.1f} s  {out}")


if __name__ == "__main__":
    main()
