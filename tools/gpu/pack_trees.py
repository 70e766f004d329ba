"""Copy extracted, verified ggml trees into .gpu/vendor/ for the GPU machine, leaving out the
backends it does not build (SYCL, OpenCL, Hexagon, Metal, ...), so several releases fit in the
device call's 64 MiB: ``python tools/gpu/pack_trees.py 0.25.3 0.26.0``, then carry ``.gpu`` and
start the command with ``cp -r .gpu/vendor/. vendor/``. (.gpu/ is git-ignored: upstream code is
never committed.)"""
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEEP = {"ggml-cpu", "ggml-cuda", "ggml-rpc", "ggml-vulkan"}


def pack(release: str) -> Path:
    src = ROOT / "vendor" / release
    if not (src / ".ggml_py-verified").exists():
        sys.exit(f"vendor/{release} is not an extracted, verified tree: "
                 f"python build_ggml.py fetch --ggml {release}")
    dest = ROOT / ".gpu" / "vendor" / release
    shutil.rmtree(dest, ignore_errors=True)

    def ignore(folder, names):
        if Path(folder) == src / "src":
            return [n for n in names if (Path(folder) / n).is_dir() and n not in KEEP]
        return []
    shutil.copytree(src, dest, ignore=ignore)
    return dest


if __name__ == "__main__":
    exclude = ROOT / ".git" / "info" / "exclude"
    if "/.gpu/" not in exclude.read_text():
        with open(exclude, "a") as f:
            f.write("/.gpu/\n")
    for rel in sys.argv[1:]:
        d = pack(rel)
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        print(f"{d}: {size / 2**20:.1f} MiB")
