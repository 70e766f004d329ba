"""The generated cffi bindings of the loaded build, apart from the Pythonic surface.

    from ggml_py.raw import ffi, lib
    lib.ggml_nbytes(t.ptr)

``lib`` holds the functions of ggml.h, ggml-alloc.h, ggml-backend.h, gguf.h and ggml-opt.h (and
the backend headers where the build links them; reach those through
``ggml_py._loader.backend_fn`` to work with ``GGML_BACKEND_DL`` builds too). Nothing here is
validated: a bad call aborts the process, as it would in C.
"""
from __future__ import annotations

from ._loader import ffi, lib

__all__ = ["ffi", "lib"]


def __dir__() -> list[str]:       # dir() and help() show the module's API only
    return sorted(__all__)
