"""What a built wheel's shared objects link against: ``python -m ggml_build.wheel_check W.whl``.

For every ELF file in the wheel: its NEEDED libraries and RUNPATH. Passes when each NEEDED
library is either in the wheel (found through an ``$ORIGIN`` runpath) or a system library a
manylinux-style platform provides (libc, libm, libstdc++, libgcc_s, libgomp, ...); prints
`auditwheel show` too where auditwheel is installed. Exit 1 on a library the wheel would miss.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# provided by the platform (the manylinux policy's list, plus OpenMP's runtime from gcc)
SYSTEM = re.compile(r"^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libgomp|"
                    r"ld-linux[\w.-]*|libvulkan|libcuda|libcudart|libcublas|libcublasLt)\.so")


def dynamic(path: Path) -> tuple[list[str], str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", out)
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.+?)\]", out)
    return needed, ":".join(runpath)


def check(wheel: Path) -> int:
    bad = 0
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as z:
        z.extractall(tmp)
        files = [p for p in Path(tmp).rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x7fELF"]
        names = {p.name for p in files}
        print(f"{wheel.name}: {len(files)} shared objects")
        for p in sorted(files):
            needed, runpath = dynamic(p)
            missing = [n for n in needed if n not in names and not SYSTEM.match(n)]
            if missing or (needed and any(n in names for n in needed) and "$ORIGIN" not in runpath):
                bad += 1
            print(f"  {p.relative_to(tmp)}  runpath={runpath or '-'}")
            for n in needed:
                where = "in wheel" if n in names else ("system" if SYSTEM.match(n) else "MISSING")
                print(f"      {n:<28} {where}")
    if shutil.which("auditwheel"):
        subprocess.run(["auditwheel", "show", str(wheel)])
    print("ok" if not bad else f"{bad} shared object(s) would not load from the installed wheel")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(max((check(Path(w)) for w in sys.argv[1:]), default=2))
