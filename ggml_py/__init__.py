"""ggml_py: drive upstream ggml's backend API from Python.

    import ggml_py as gg
    gg.ggml_version()                  # release of the loaded build
    for d in gg.devices(): print(d.name, d.type, d.caps)

Set ``GGML_PY_BUILD`` to a build folder (or its name under ggml_py/lib/) before import to load
another release; set ``GGML_METAL_DEVICES=N`` (macOS) before the first device lookup to get N
Metal virtual devices.

The house, from the loader up (each module imports only modules listed before it):
``errors`` -> ``_loader`` -> ``_handle`` (owned/borrowed handles) -> ``_liveness`` (RPC
servers, by endpoint) -> ``_types`` -> ``_buffer`` -> ``_transfer`` -> ``_backend`` ->
``_event`` -> ``_device`` (registries, devices, buffer types) -> ``_tensor_base`` (tensor
facts) -> ``ops`` (op builders by family) -> ``_tensor`` (Tensor and its operators) ->
``_context`` -> ``dlpack`` -> ``_graph`` -> ``_scheduler`` -> ``rpc``/``gguf`` (loaded on
first use) -> this face. ``ggml_py.raw`` gives the generated bindings.
"""
from __future__ import annotations

import importlib as _importlib
from typing import Any as _Any

from . import ops
from ._backend import Backend
from ._buffer import Buffer, aligned_empty
from ._context import Context
from ._device import (BufferType, Caps, Device, DeviceList, Registry, device, devices,
                      registries)
from ._event import Event
from ._graph import Graph
from ._loader import BUILD, BUILD_DIR, ffi, lib
from ._loader import cstr as _cstr
from ._scheduler import Scheduler
from ._tensor import Tensor
from ._transfer import copy, copy_async
from ._types import TYPES, GGMLType, quantize
from .errors import (ClosedError, GGMLError, GGMLWarning, InvalidArgument, InvalidType,
                     NotFound, OutOfMemory, RPCError, RPCVersionError, UnsupportedError)
from .ops import *  # noqa: F401,F403  (ggml ops by their ggml names)

__version__ = "0.1.0"

globals().update(TYPES)  # gg.f32, gg.f16, gg.q4_0, ...


def __getattr__(name: str) -> _Any:
    # gg.rpc, gg.gguf, gg.opt, gg.compare and DLPack load on first use: sockets,
    # subprocesses, GGUF parsing, training and the DLPack structs (parsed by cffi, about
    # 30 ms) are not needed by every import
    if name in ("rpc", "dlpack", "gguf", "opt", "compare"):
        return _importlib.import_module(f".{name}", __name__)
    if name == "from_dlpack":
        from .dlpack import from_dlpack
        return from_dlpack
    raise AttributeError(f"module 'ggml_py' has no attribute {name!r}")


def ggml_version() -> str:
    """The upstream ggml release of the loaded library (e.g. "0.25.3")."""
    if hasattr(lib, "ggml_version"):
        return _cstr(lib.ggml_version()) or str(BUILD["release"])
    return str(BUILD["release"])


def ggml_commit() -> str:
    """The ggml tree's own commit, as ggml's CMake found it when the library was built
    ("unknown" for trees extracted from a release's sdist, which carry no git history)."""
    if hasattr(lib, "ggml_commit"):
        return _cstr(lib.ggml_commit()) or "unknown"
    return str(BUILD.get("ggml_commit", "unknown"))


def build_info() -> dict[str, _Any]:
    """Facts of the loaded build: folder, release, backends, bindings mode."""
    return {"folder": str(BUILD_DIR), "release": BUILD["release"], "backends": BUILD["backends"],
            "bindings": BUILD["bindings"], "functions": BUILD["functions"]}


__all__ = [
    "__version__", "ggml_version", "ggml_commit", "build_info", "registries", "devices", "device", "Registry",
    "Device", "DeviceList", "Caps", "BufferType", "Buffer", "Backend", "Event", "Context",
    "Tensor", "Graph", "Scheduler", "GGMLType", "TYPES", "quantize", "copy", "copy_async",
    "from_dlpack", "aligned_empty", "GGMLError", "ClosedError", "UnsupportedError",
    "InvalidArgument", "InvalidType", "NotFound", "OutOfMemory", "RPCError", "RPCVersionError",
    "GGMLWarning", "BUILD", "BUILD_DIR", "ffi", "lib", "ops", "rpc", "gguf", "dlpack",
    *ops.__all__, *TYPES,
]


def __dir__() -> list[str]:
    return sorted(set(__all__))
