"""Owned handles: idempotent close(), context manager, a finalizer holding only the raw handle.

Borrowed handles (registries, devices, buffer types) belong to ggml and are plain objects.
Owned ones derive from :class:`Owned`. A child keeps its parents alive through ordinary
references; a parent's close() closes the children still open first.
"""
from __future__ import annotations

import warnings
import weakref

from .errors import ClosedError, GGMLWarning


LIVE = weakref.WeakSet()   # every open owned object, for closing what depends on a server


def _release(free, raw, what: str, guard=None) -> None:
    if guard is not None and not guard():
        warnings.warn(f"not freeing {what}: its RPC server is gone", GGMLWarning, stacklevel=1)
        return
    try:
        free(raw)
    except Exception as e:  # never raise from a finalizer
        warnings.warn(f"freeing {what} failed: {e!r}", GGMLWarning, stacklevel=1)


class Owned:
    """Base of objects that own a ggml handle."""

    _kind = "object"

    def __init__(self, raw, free, *, parents=(), guard=None):
        self._raw = raw
        self._parents = tuple(parents)          # strong: a child keeps its parents alive
        self._children = weakref.WeakSet()
        # `guard` (optional) says whether freeing is still safe: ggml's RPC client aborts the
        # process when it frees remote memory of a server that has died.
        self._finalizer = weakref.finalize(self, _release, free, raw, self._kind, guard)
        LIVE.add(self)
        for p in self._parents:
            if isinstance(p, Owned):
                p._children.add(self)

    @property
    def ptr(self):
        """The raw cffi handle; raises :class:`ClosedError` once closed."""
        if self._raw is None:
            raise ClosedError(f"this {self._kind} is closed")
        for p in self._parents:
            if isinstance(p, Owned) and p._raw is None:
                raise ClosedError(f"this {self._kind}'s {p._kind} is closed")
        return self._raw

    @property
    def closed(self) -> bool:
        return self._raw is None

    def close(self) -> None:
        """Free the handle now. Idempotent; children still open are closed first."""
        if self._raw is None:
            return
        for child in list(self._children):
            child.close()
        self._raw = None
        self._finalizer()

    def _devices(self) -> set:
        """Raw device handles this object depends on (for closing it with its RPC server)."""
        return set()

    def __enter__(self):
        self.ptr  # refuse to enter a closed object
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Borrowed:
    """A handle that belongs to ggml (registry, device, buffer type): never freed here;
    equal when the handles are."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __eq__(self, other):
        return type(other) is type(self) and self.ptr == other.ptr

    def __hash__(self):
        from ._loader import ffi
        return hash(int(ffi.cast("uintptr_t", self.ptr)))
