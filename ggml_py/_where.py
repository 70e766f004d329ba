"""Where the build is: the folder ``GGML_PY_BUILD`` names, or the default release's default
configuration under the package's ``lib/``. Nothing here loads a library: ``import ggml_py``
asks only this (:func:`check`) and loads the build on first use (``_loader``).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
LIB_ROOT = PACKAGE / "lib"
MODULE = "_ggml_cffi"


def _default_name() -> str:
    """ggml-<default release>-<default backends for this platform>, as build_ggml.py names it."""
    manifest = PACKAGE.parent / "vendor" / "releases.toml"
    if manifest.exists():
        # the manifest's top-level `default = "x.y.z"` (no TOML parser needed at import)
        m = re.search(r'^default\s*=\s*"([^"]+)"', manifest.read_text(), re.M)
        if m is None:
            raise ImportError(f"ggml_py: {manifest} names no default release")
        release = m.group(1)
    else:  # installed without the source tree: the only build shipped is the default
        found = sorted(LIB_ROOT.glob("ggml-*/build.json"))
        if not found:
            return "ggml-<release>-cpu-rpc"
        return found[0].parent.name
    parts = ["ggml", release, "cpu", "rpc"]
    if sys.platform == "darwin":
        parts.append("metal")
    return "-".join(parts)


def build_dir() -> Path:
    sel = os.environ.get("GGML_PY_BUILD")
    if sel:
        path = Path(sel)
        if not path.is_absolute() and not path.exists():
            path = LIB_ROOT / sel
        # absolute, here and for child processes (RPC servers, notebook kernels) that start
        # in another directory and read the same variable
        path = path.absolute()
        if path.is_dir():
            os.environ["GGML_PY_BUILD"] = str(path)
        return path
    wanted = LIB_ROOT / _default_name()
    if (wanted / "build.json").exists():
        return wanted
    # The default configuration may carry extra backends (CUDA on a GPU machine): take the
    # default release's build with the fewest extras, a portable one only when nothing else is.
    stem = wanted.name
    cands = sorted((p for p in LIB_ROOT.glob(stem + "-*") if (p / "build.json").exists()),
                   key=lambda p: (p.name.endswith("-portable"), len(p.name)))
    return cands[0] if cands else wanted


def available_builds() -> list[Path]:
    """Finished build folders under lib/ (a folder without build.json is not one)."""
    return sorted(p.parent for p in LIB_ROOT.glob("*/build.json"))


def _missing_build_message(folder: Path) -> str:
    found = available_builds()
    have = ("builds here: " + ", ".join(p.name for p in found)) if found else \
        f"there is no build in {LIB_ROOT}"
    if os.environ.get("GGML_PY_BUILD"):
        return (f"ggml_py: GGML_PY_BUILD={os.environ['GGML_PY_BUILD']} names no finished build "
                f"({folder}); {have}. Set GGML_PY_BUILD to one of them, or make one with: "
                "python build_ggml.py --ggml <release> [--backends ...] (it prints the folder)")
    return (f"ggml_py: no ggml build in {folder}; {have}. Build the default with: "
            "python build_ggml.py (from the source checkout), or reinstall: pip install -e .")


def check() -> Path:
    """The build folder, or ImportError saying exactly what to run."""
    folder = build_dir()
    if not (folder / "build.json").exists():
        raise ImportError(_missing_build_message(folder))
    return folder
