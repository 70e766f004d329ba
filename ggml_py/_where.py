"""Where the build is: the folder ``GGML_PY_BUILD`` names, or the default release's default
configuration under the package's ``lib/``. Nothing here loads a library: ``import ggml_py``
asks only this (:func:`check`) and loads the build on first use (``_loader``).

Build folders are named ``ggml-<release>-<backends...>[-native][-portable]`` (build_ggml.py,
``ggml_build.flags.config_name``). Releases compare as versions, never as strings
("0.9.4" < "0.15.3" < "0.26.0"), wherever builds are chosen or listed.
"""
from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
LIB_ROOT = PACKAGE / "lib"
MODULE = "_ggml_cffi"
#: the source checkout's pins; an installed package has none (its wheel holds one build)
MANIFEST = PACKAGE.parent / "vendor" / "releases.toml"

_NAME = re.compile(r"^ggml-(\d+(?:\.\d+)*)-(.+)$")


def version_key(release: str) -> tuple[int, ...]:
    """A release as a tuple of numbers: "0.9.4" < "0.15.3" < "0.26.0"."""
    return tuple(int(p) for p in re.findall(r"\d+", release))


def parse_name(name: str) -> tuple[str, list[str]] | None:
    """(release, configuration parts) of a build folder name; None for other names."""
    m = _NAME.match(name)
    return (m.group(1), m.group(2).split("-")) if m else None


def name_key(name: str) -> tuple[tuple[int, ...], str]:
    """Sort key of build folder names: by release as a version, then by name."""
    parsed = parse_name(name)
    return (version_key(parsed[0]) if parsed else (), name)


def platform_backends(system: str | None = None) -> tuple[str, ...]:
    """The backends a default build has on `system` (platform.system()'s name), GPUs aside:
    CPU and RPC, and Metal on macOS (as ``ggml_build.flags.default_backends``)."""
    system = system or platform.system()
    return ("cpu", "rpc", "metal") if system == "Darwin" else ("cpu", "rpc")


def choose(names: Iterable[str], release: str | None, system: str | None = None) -> str | None:
    """The folder to load by default among finished builds `names`: of `release` (None: the
    newest release there), its platform-default configuration when built, else that release's
    build with the fewest extras (a CUDA build on a GPU machine, a cpu,rpc-only build on macOS),
    a portable one only when nothing else is. Builds of local trees (``--source``) are never
    chosen by default. None when no build fits."""
    wanted = list(platform_backends(system))
    builds = []
    for name in names:
        parsed = parse_name(name)
        if parsed is None or parsed[1][:2] != ["cpu", "rpc"] or \
                any(p.startswith("src") for p in parsed[1]):
            continue
        builds.append((parsed[0], parsed[1], name))
    if release is None:
        if not builds:
            return None
        release = max((b[0] for b in builds), key=version_key)
    fits = [(parts != wanted, "portable" in parts, len(parts), name)
            for rel, parts, name in builds if rel == release]
    return min(fits)[-1] if fits else None


def default_release() -> str | None:
    """The source checkout's default release (vendor/releases.toml); None when installed."""
    if not MANIFEST.exists():
        return None
    # the manifest's top-level `default = "x.y.z"` (no TOML parser needed at import)
    m = re.search(r'^default\s*=\s*"([^"]+)"', MANIFEST.read_text(), re.M)
    if m is None:
        raise ImportError(f"ggml_py: {MANIFEST} names no default release")
    return m.group(1)


def _default_name() -> str:
    """The default build's folder name: in a source checkout the default release's (as
    build_ggml.py names it on this platform); installed, the wheel's build (the newest
    release under lib/, there is one)."""
    release = default_release()
    found = choose((p.name for p in available_builds()), release)
    if found is not None:
        return found
    return "-".join(["ggml", release or "<release>", *platform_backends()])


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
    return LIB_ROOT / _default_name()


def available_builds() -> list[Path]:
    """Finished build folders under lib/ (a folder without build.json is not one), oldest
    release first (as versions)."""
    return sorted((p.parent for p in LIB_ROOT.glob("*/build.json")), key=lambda p: name_key(p.name))


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
