"""One error family, and the one checker that raises it.

Everything ggml_py raises derives from :class:`GGMLError` (a ``RuntimeError``). Validation
errors also derive from ``ValueError``/``TypeError``, lookups from ``LookupError``, so the
usual ``except ValueError`` keeps working; RPC failures derive from ``ConnectionError``. Finalizers never raise: they warn with
:class:`GGMLWarning`.
"""
from __future__ import annotations

from typing import Any


class GGMLError(RuntimeError):
    """Base of every error ggml_py raises."""


class ClosedError(GGMLError):
    """An owned object (buffer, backend, event, context, ...) was used after close()."""


class UnsupportedError(GGMLError):
    """The device or backend cannot do what was asked (no events, op not supported, ...)."""


class InvalidArgument(GGMLError, ValueError):
    """A shape, size, bound or value ggml would have aborted on."""


class InvalidType(GGMLError, TypeError):
    """A dtype or ggml type an operation does not accept."""


class NotFound(GGMLError, LookupError):
    """No registry/device/backend matches a lookup."""


class RPCError(GGMLError, ConnectionError):
    """An RPC server is unreachable, busy, gone, or speaks another protocol version: raised
    before ggml's RPC client would abort the process."""


class RPCVersionError(RPCError):
    """The server is of a ggml release whose RPC protocol this build cannot talk to."""


class UnwrittenError(InvalidArgument):
    """Reading a tensor whose values no one wrote (no set, load, copy or compute since its
    memory was placed); ``t.raw_numpy()`` reads raw memory on purpose."""


class OutOfMemory(GGMLError, MemoryError):
    """A device could not allocate, or a size exceeds what can exist (ggml would abort on its
    failed malloc)."""


class GGMLWarning(RuntimeWarning):
    """Problems met in finalizers, where raising is not an option."""


def check_status(status: Any, what: str) -> None:
    """Raise for an ``enum ggml_status`` other than ``GGML_STATUS_SUCCESS``, with ggml's own
    words (``ggml_status_to_string``): :class:`OutOfMemory` for
    ``GGML_STATUS_ALLOC_FAILED``, :class:`GGMLError` for the others (failed, aborted)."""
    s = int(status)
    if s == 0:
        return
    # (this module is the bottom of the package; a failed status comes from a call through
    # the loaded bindings, so the loader has run by now)
    from ._loader import ffi, lib
    text = ffi.string(lib.ggml_status_to_string(s)).decode(errors="replace")
    exc = OutOfMemory if s == int(lib.GGML_STATUS_ALLOC_FAILED) else GGMLError
    raise exc(f"{what} failed: {text} (ggml status {s})")


def check_ptr(ptr: Any, what: str, exc: type[GGMLError] = GGMLError) -> Any:
    """Return `ptr`, or raise `exc` saying `what` when ggml returned NULL for it (pass
    :class:`OutOfMemory` where NULL means an allocation failed)."""
    if ptr is None or not ptr:              # (a cffi pointer is false when NULL)
        raise exc(f"{what} (ggml returned NULL)")
    return ptr


def require(cond: bool, message: str, exc: type[GGMLError] = InvalidArgument) -> None:
    """Validation before calling into C, where ggml would abort the process instead."""
    if not cond:
        raise exc(message)

__all__ = ["GGMLError", "ClosedError", "UnsupportedError", "InvalidArgument", "InvalidType",
           "NotFound", "RPCError", "RPCVersionError", "OutOfMemory", "GGMLWarning",
           "UnwrittenError"]


def __dir__() -> list[str]:       # dir() and help() show the module's API only
    return sorted(__all__)
