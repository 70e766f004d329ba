"""ggml_py: drive upstream ggml's backend API from Python.

    import ggml_py as gg
    gg.ggml_version()                  # release of the loaded build
    for d in gg.devices(): print(d.name, d.type, d.caps)

Set ``GGML_PY_BUILD`` to a build folder (or its name under ggml_py/lib/) before import to load
another release; set ``GGML_METAL_DEVICES=N`` (macOS) before the first device lookup to get N
Metal virtual devices.
"""
from __future__ import annotations

from ._loader import BUILD, BUILD_DIR, cstr, ffi, lib
from .errors import (ClosedError, GGMLError, GGMLWarning, InvalidArgument, InvalidType,
                     NotFound, RPCError, RPCVersionError, UnsupportedError)
from .registry import Caps, Device, Registry, device, devices, registries
from .buffer import Buffer, BufferType, OutOfMemory, aligned_empty
from .backend import Backend
from .event import Event
from .types import GGMLType, TYPES, quantize
from .tensor import Context, Tensor
from .transfer import copy, copy_async
from .ops import *  # noqa: F401,F403  (ggml ops by their ggml names)
from .ops import matmul
from .graph import Graph
from .scheduler import Scheduler
from . import ops

globals().update(TYPES)  # gg.f32, gg.f16, gg.q4_0, ...


def __getattr__(name):
    # gg.rpc and DLPack load on first use: sockets, subprocesses and the DLPack structs
    # (parsed by cffi, about 30 ms) are not needed by every import
    if name in ("rpc", "dlpack"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    if name == "from_dlpack":
        from .dlpack import from_dlpack
        return from_dlpack
    raise AttributeError(f"module 'ggml_py' has no attribute {name!r}")


def ggml_version() -> str:
    """The upstream ggml release of the loaded library (e.g. "0.25.3")."""
    if hasattr(lib, "ggml_version"):
        return cstr(lib.ggml_version())
    return BUILD["release"]


def build_info() -> dict:
    """Facts of the loaded build: folder, release, backends, bindings mode."""
    return {"folder": str(BUILD_DIR), "release": BUILD["release"], "backends": BUILD["backends"],
            "bindings": BUILD["bindings"], "functions": BUILD["functions"]}


__all__ = [
    "ggml_version", "build_info", "registries", "devices", "device", "Registry", "Device", "Caps",
    "BufferType", "Buffer", "Backend", "Event", "Context", "Tensor", "Graph", "Scheduler", "GGMLType",
    "TYPES", "quantize", "copy", "copy_async", "from_dlpack", "aligned_empty", "matmul",
    "GGMLError", "ClosedError", "UnsupportedError", "InvalidArgument", "InvalidType", "NotFound",
    "OutOfMemory", "RPCError", "RPCVersionError", "GGMLWarning", "ffi", "lib",
]
