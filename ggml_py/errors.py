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


_STATUS = {-1: "allocation failed", -2: "failed", 1: "aborted"}


def check(result: Any, what: str, *, null: Any = None) -> Any:
    """Raise for a failed ggml call, else return `result`.

    `result` is either an ``enum ggml_status`` (0 is success) or a pointer, checked against
    `null` (pass ``ffi.NULL``).
    """
    if null is not None:
        if result == null:
            raise GGMLError(f"{what} failed (ggml returned NULL)")
        return result
    if result != 0:
        raise GGMLError(f"{what} failed: {_STATUS.get(int(result), f'status {int(result)}')}")
    return result


def require(cond: bool, message: str, exc: type[GGMLError] = InvalidArgument) -> None:
    """Validation before calling into C, where ggml would abort the process instead."""
    if not cond:
        raise exc(message)

__all__ = ["GGMLError", "ClosedError", "UnsupportedError", "InvalidArgument", "InvalidType",
           "NotFound", "RPCError", "RPCVersionError", "OutOfMemory", "GGMLWarning",
           "UnwrittenError"]


def __dir__() -> list[str]:       # dir() and help() show the module's API only
    return sorted(__all__)
