"""The one place that loads a build: ``ffi``, ``lib`` and the build's facts.

``_where`` finds the folder: the package's own ``lib/`` folder for the default release's
default configuration, or the one ``GGML_PY_BUILD`` (a folder, or a folder name under
``lib/``) selects. When nothing is found the error says exactly what to run.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from ._where import LIB_ROOT, MODULE, PACKAGE, available_builds, build_dir
from ._where import _missing_build_message
from .errors import GGMLError


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

#: the version of ggml_build/helpers.c this package calls (ggml_py_helpers() returns it;
#: bumped whenever an entry point's arguments change)
HELPERS_VERSION = 2
#: whether the build's helpers are that version. A build made by an older ggml_py (the
#: package updated, the build not) has helpers whose arguments differ: its checked ops stay
#: unused (every op takes its Python path, slower and otherwise the same), and a warning says
#: to rebuild
HELPERS = (getattr(lib, "ggml_py_helpers", None) is not None
           and int(lib.ggml_py_helpers()) == HELPERS_VERSION)
if not HELPERS and hasattr(lib, "ggml_py_binary"):
    import warnings
    from .errors import GGMLWarning
    warnings.warn(f"ggml_py: the build {BUILD_DIR.name} was made by another version of ggml_py "
                  f"(its C helpers differ); its fast paths are off until it is rebuilt (python "
                  f"build_ggml.py --ggml {BUILD.get('release', '<release>')})", GGMLWarning,
                  stacklevel=1)

# ggml's log goes to logging.getLogger("ggml") from the first call on (ggml_py._log)
from . import _log  # noqa: E402
_log.install(ffi, lib)

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


def cstr(p: Any) -> str | None:
    """A C string from ggml as a Python str (None for NULL)."""
    return None if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


__all__ = ["ffi", "lib", "BUILD", "BUILD_DIR", "backend_fn", "cstr", "GGMLError",
           "LIB_ROOT", "MODULE", "PACKAGE", "available_builds", "build_dir"]
