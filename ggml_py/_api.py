"""The one count of a build's C API: ggml's functions the bindings expose.

``python -m ggml_py`` and ``python -m ggml_py compare`` both count with :func:`function_names`:
the functions of ``lib`` that ggml declares and the build exports, without ggml_py's own C
helpers (``ggml_py_*``, helpers.c), which are no part of ggml's API.
"""
from __future__ import annotations

from typing import Any

HELPER_PREFIX = "ggml_py_"


def function_names(ffi: Any, lib: Any) -> list[str]:
    """Sorted names of ggml's functions in `lib` (declared and exported; helpers left out)."""
    out = []
    for name in dir(lib):
        if name.startswith(HELPER_PREFIX):
            continue
        try:
            obj = getattr(lib, name)
        except Exception:                 # declared but not exported by this build
            continue
        if isinstance(obj, int):
            continue
        try:
            ct = ffi.typeof(obj)
        except (TypeError, ffi.error):
            continue
        if ct.kind == "pointer":
            ct = ct.item
        if ct.kind == "function":
            out.append(name)
    return sorted(out)


__all__ = ["function_names", "HELPER_PREFIX"]
