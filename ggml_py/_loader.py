"""The one place that finds and loads a build: ``ffi``, ``lib`` and the build's facts.

Looks in the package's own ``lib/`` folder for the default release's default configuration;
``GGML_PY_BUILD`` (a folder, or a folder name under ``lib/``) selects another build. When
nothing is found the error says exactly what to run.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from .errors import GGMLError

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


def _import_file(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"ggml_py: cannot import the bindings {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load() -> tuple[Any, Any, dict[str, Any], Path]:
    folder = build_dir()
    info_path = folder / "build.json"
    if not info_path.exists():
        raise ImportError(_missing_build_message(folder))
    info = json.loads(info_path.read_text())
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # ggml's abort handler would spawn gdb
    if "vulkan" in info.get("backends", []):
        from ._vulkan import expose_software_devices
        expose_software_devices()                      # before ggml reads the variable
    if info["bindings"] == "api":
        found = sorted(folder.glob(f"{MODULE}.*so")) + sorted(folder.glob(f"{MODULE}.*pyd"))
        if not found:
            raise ImportError(f"ggml_py: {folder} has no compiled bindings; rebuild it with build_ggml.py")
        mod = _import_file(found[0])
        ffi, lib = mod.ffi, mod.lib
    else:
        ffi = _import_file(folder / f"{MODULE}.py").ffi
        suffix = ".dylib" if sys.platform == "darwin" else ".so"
        # libggml depends on every other library of the build, so its handle resolves all.
        lib = ffi.dlopen(str(folder / f"libggml{suffix}"))
    return ffi, lib, info, folder


ffi, lib, BUILD, BUILD_DIR = load()

if BUILD.get("backend_dl"):
    # GGML_BACKEND_DL=ON: the backends are modules ggml loads at run time. ggml would look in
    # the interpreter's folder; ours are beside this build's libraries. Among the CPU variants
    # (GGML_CPU_ALL_VARIANTS) ggml picks the best one this processor runs.
    lib.ggml_backend_load_all_from_path(str(BUILD_DIR).encode())


def backend_fn(name: str, ctype: str) -> Any:
    """A backend-specific entry point (``ggml_backend_rpc_add_server``,
    ``ggml_backend_cpu_set_n_threads``, ...): the linked function where the build links the
    backend, else what a registry's ``ggml_backend_reg_get_proc_address`` returns for `name`,
    cast to `ctype` (e.g. ``"ggml_backend_reg_t (*)(const char *)"``); None when no registry
    offers it. The same code then works with ``GGML_BACKEND_DL`` on or off."""
    try:
        return getattr(lib, name)
    except AttributeError:
        pass
    key = name.encode()
    for i in range(lib.ggml_backend_reg_count()):
        p = lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_reg_get(i), key)
        if p != ffi.NULL:
            return ffi.cast(ctype, p)
    return None


@functools.lru_cache(maxsize=1)
def old_rpc_api() -> bool:
    """Whether this build's RPC backend is 0.9.x's: one device per endpoint
    (``ggml_backend_rpc_add_device``, named "RPC[host:port]"), a server of one backend
    (``ggml_backend_rpc_start_server(backend, ...)``) and an empty HELLO; 0.10 brought the
    server registries (``ggml_backend_rpc_add_server``) with several devices per server."""
    return (backend_fn("ggml_backend_rpc_add_server", "void *") is None
            and backend_fn("ggml_backend_rpc_add_device", "void *") is not None)


def cstr(p: Any) -> str | None:
    """A C string from ggml as a Python str (None for NULL)."""
    return None if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


__all__ = ["ffi", "lib", "BUILD", "BUILD_DIR", "backend_fn", "old_rpc_api", "cstr",
           "GGMLError"]
