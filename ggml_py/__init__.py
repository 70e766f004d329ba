"""ggml_py: upstream ggml's backend API from Python, with numpy semantics.

    import numpy as np, ggml_py as gg
    be = gg.device("CPU").backend()
    ctx = gg.Context()
    a = ctx.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    ctx.alloc(be)                       # memory, and from_numpy's values
    y = a * 2 + [1, 2, 3]               # numpy's rules; the list is a constant leaf
    be.compute(gg.Graph(y)); y.numpy()

Start with :func:`devices`/:func:`device`, :class:`Context`, :class:`Tensor`,
:class:`Graph`, :class:`Scheduler`; ggml's ops by their ggml names (``gg.mul_mat``,
``gg.soft_max``...); modules ``gg.rpc``, ``gg.gguf``, ``gg.opt``, ``gg.dlpack``; the
generated bindings in ``ggml_py.raw``. ggml's log goes to ``logging.getLogger("ggml")``.

``GGML_PY_BUILD`` (a build folder, or its name under ggml_py/lib/) picks another release
before import. How the package is built inside: docs/architecture.md.
"""
from __future__ import annotations

from _thread import RLock as _RLock
import importlib as _importlib
from typing import TYPE_CHECKING
from typing import Any as _Any

from . import _where
from .errors import ClosedError as ClosedError, GGMLError as GGMLError
from .errors import GGMLWarning as GGMLWarning, InvalidArgument as InvalidArgument
from .errors import InvalidType as InvalidType, NotFound as NotFound
from .errors import OutOfMemory as OutOfMemory, RPCError as RPCError
from .errors import RPCVersionError as RPCVersionError, UnsupportedError as UnsupportedError
from .errors import UnwrittenError as UnwrittenError

__version__ = "0.1.0"

# `import ggml_py` finds the build (or raises ImportError saying what to run) and stops there:
# the library and the modules over it load on first use of any name below (PEP 562), so an
# import stays cheap; the first use pays the rest once.
try:
    _where.check()
except ImportError as _e:
    import sys as _sys
    _orig = getattr(_sys, "orig_argv", [])
    if (_sys.argv[:1] == ["-m"] and "-m" in _orig[:-1]
            and _orig[_orig.index("-m") + 1].split(".")[0] == __name__):
        # `python -m ggml_py ...` without a build: one line saying what to run, no traceback
        print(f"python -m {_orig[_orig.index('-m') + 1]}: {str(_e).removeprefix('ggml_py: ')}",
              file=_sys.stderr)
        raise SystemExit(2) from None
    raise

if TYPE_CHECKING:                  # what type checkers and readers see: the whole face
    from . import ops as ops
    from ._backend import Backend as Backend
    from ._buffer import Buffer as Buffer, aligned_empty as aligned_empty
    from ._context import Context as Context
    from ._device import (BufferType as BufferType, Caps as Caps, Device as Device,
                          DeviceList as DeviceList, Registry as Registry, device as device,
                          devices as devices, registries as registries)
    from ._event import Event as Event
    from ._graph import Graph as Graph
    from ._meta import meta_device as meta_device
    from ._meta_plan import meta_reduce as meta_reduce
    from ._split import Split as Split
    from ._loader import BUILD as BUILD, BUILD_DIR as BUILD_DIR, ffi as ffi, lib as lib
    from ._scheduler import Scheduler as Scheduler
    from ._tensor import Tensor as Tensor
    from ._transfer import copy as copy, copy_async as copy_async
    from ._types import TYPES as TYPES, GGMLType as GGMLType, quantize as quantize
    from .ops import *  # noqa: F401,F403  (ggml ops by their ggml names)

# the names of the face that do not depend on the release (ops and types do)
_FACE = [
    "__version__", "ggml_version", "ggml_commit", "build_info", "registries", "devices",
    "device", "Registry", "Device", "DeviceList", "Caps", "BufferType", "Buffer", "Backend",
    "Event", "Context", "Tensor", "Graph", "Scheduler", "GGMLType", "TYPES", "quantize",
    "copy", "copy_async", "from_dlpack", "aligned_empty", "GGMLError", "ClosedError",
    "UnsupportedError", "UnwrittenError", "InvalidArgument", "InvalidType", "NotFound",
    "OutOfMemory", "RPCError", "RPCVersionError", "GGMLWarning", "BUILD", "BUILD_DIR", "ops",
    "rpc", "gguf", "dlpack", "opt", "Split", "meta_device", "meta_reduce"]
# (gg.ffi and gg.lib still work; the raw bindings' own name is ggml_py.raw)


def _load() -> None:
    """Load the build and the core modules, in the house's order, and put their names on
    the package (once: later lookups find them in the module's dict). A second thread
    waits for the first; a module of the core that asks for the face while it loads (same
    thread) gets AttributeError, as from a module still being imported."""
    global _loading
    with _load_lock:
        if "__all__" in globals():     # loaded already (perhaps by another thread)
            return
        if _loading:
            raise AttributeError("ggml_py is still loading")
        _loading = True
        try:
            globals().update(_load_core())
        finally:
            _loading = False


_loading = False
_load_lock = _RLock()


# where each name of the face lives, in the order the modules load (the house's order)
_HOMES = {
    "_backend": ("Backend",), "_buffer": ("Buffer", "aligned_empty"), "_context": ("Context",),
    "_device": ("BufferType", "Caps", "Device", "DeviceList", "Registry", "device", "devices",
                "registries"),
    "_event": ("Event",), "_graph": ("Graph",),
    "_split": ("Split",), "_meta": ("meta_device",), "_meta_plan": ("meta_reduce",), "_loader": ("BUILD", "BUILD_DIR", "ffi", "lib"),
    "_scheduler": ("Scheduler",), "_tensor": ("Tensor",), "_transfer": ("copy", "copy_async"),
    "_types": ("TYPES", "GGMLType", "quantize")}


def _load_core() -> dict[str, _Any]:
    ops = _importlib.import_module(f"{__name__}.ops")   # (not `from . import`: that would
    names: dict[str, _Any] = {"ops": ops}               # ask __getattr__ again)
    for module, attrs in _HOMES.items():
        m = _importlib.import_module(f"{__name__}.{module}")
        names.update((a, getattr(m, a)) for a in attrs)
    TYPES = names["TYPES"]
    names.update((n, getattr(ops, n)) for n in ops.__all__)
    names.update(TYPES)                    # gg.f32, gg.f16, gg.q4_0, ...
    names["__all__"] = [*_FACE, *ops.__all__, *TYPES]
    return names


_LAZY_MODULES = ("rpc", "dlpack", "gguf", "opt", "compare", "raw")
_MISSING = object()


def __getattr__(name: str) -> _Any:
    # gg.rpc, gg.gguf, gg.opt, gg.compare and DLPack load on first use: sockets,
    # subprocesses, GGUF parsing, training and the DLPack structs (which cffi parses when
    # first used) are not needed by every import
    if name in _LAZY_MODULES or name == "ops" or (name.startswith("_") and name[1:2] != "_"):
        # a module of the package (gg.ops, gg.rpc, gg._loader, ...), and what `from . import
        # ops` inside the package asks for: the module alone, whatever is loaded so far
        try:
            return _importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'ggml_py' has no attribute {name!r}") from None
    if name == "from_dlpack":
        from .dlpack import from_dlpack
        return from_dlpack
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module 'ggml_py' has no attribute {name!r}")
    if "__all__" not in globals():   # the first use of the face: load it, then look again
        _load()
        found = globals().get(name, _MISSING)
        if found is not _MISSING:
            return found
    raise AttributeError(f"module 'ggml_py' has no attribute {name!r}")


def ggml_version() -> str:
    """The upstream ggml release of the loaded library (e.g. "0.25.3")."""
    from ._features import VERSION_STRING
    from ._loader import BUILD, cstr, lib
    if VERSION_STRING:
        return cstr(lib.ggml_version()) or str(BUILD["release"])
    return str(BUILD["release"])


def ggml_commit() -> str:
    """The ggml tree's own commit, as ggml's CMake found it when the library was built
    ("unknown" for trees extracted from a release's sdist, which carry no git history)."""
    from ._features import COMMIT_STRING
    from ._loader import BUILD, cstr, lib
    if COMMIT_STRING:
        return cstr(lib.ggml_commit()) or "unknown"
    return str(BUILD.get("ggml_commit", "unknown"))


def build_info() -> dict[str, _Any]:
    """Facts of the loaded build: folder, release, backends, bindings mode."""
    from ._loader import BUILD, BUILD_DIR
    from ._api import function_names
    from ._loader import ffi, lib
    return {"folder": str(BUILD_DIR), "release": BUILD["release"], "backends": BUILD["backends"],
            "bindings": BUILD["bindings"], "functions": len(function_names(ffi, lib))}


def __dir__() -> list[str]:
    _load()
    return sorted(set(globals()["__all__"]))
