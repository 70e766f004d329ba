"""Owned handles: idempotent close(), context manager, a finalizer holding only the raw handle.

Borrowed handles (registries, devices, buffer types) belong to ggml and are plain objects.
Owned ones derive from :class:`Owned`. A child keeps its parents alive through ordinary
references; a parent's close() closes the children still open first. What else a close does
is data: the steps given to :meth:`Owned.on_close`, run in order. docs/ownership.md has the
words (owner, borrower, export) and who frees what when.

Threads: cffi releases the GIL around every C call, so two Python threads can be inside ggml
at once. Each owned object carries a re-entrant lock (``_lock``); the calls ggml does not
make thread-safe (building tensors in a context, computing or queueing on a backend, freeing)
hold it, and close() takes it, so closing an object another thread is using waits for that
use to end instead of freeing memory under it.

Every free goes through :func:`ggml_py._finalize.finalize`, which waits for a running cyclic
collection to end.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, TypeVar

from ._finalize import finalize, free_now, hand_to
from ._loader import ffi
from .errors import ClosedError, GGMLWarning

LIVE: "weakref.WeakSet[Owned]" = weakref.WeakSet()   # every open owned object

# Counts the events after which tensors may have lost their memory: every close and every
# hand-back of placed memory (see changed()). What was checked at an older count (a graph
# validated for a backend, a scheduler's placement) may point into memory that is gone, so it
# is checked again. Read as ``_handle.MEMORY_CHANGES`` (two bumps racing may count once: it
# changes, which is what counts).
MEMORY_CHANGES = 0


def changed() -> None:
    """Tensors may have lost their memory (a close, a scheduler handing its placement back):
    every graph checks again before its next compute."""
    global MEMORY_CHANGES
    MEMORY_CHANGES += 1

_O = TypeVar("_O", bound="Owned")

# A forked child cannot run ggml's CPU compute on more than one thread: ggml's OpenMP
# runtime (libgomp) has no at-fork handler, and its pool of the parent's threads does not
# exist in the child, which then waits forever. In a child every thread count of ggml_py
# (each CPU backend's, set through Backend.n_threads) is therefore 1: THREADS_AFTER_FORK, and
# the backends alive at the fork are set to it (``Owned._forked``, which Backend overrides).
THREADS_AFTER_FORK: int | None = None


def _after_fork() -> None:
    global THREADS_AFTER_FORK
    THREADS_AFTER_FORK = 1
    for obj in list(LIVE):
        try:
            obj._forked()
        except Exception:    # (closed meanwhile: nothing to set)
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _release(free: Callable[[Any], Any], raw: Any, what: str,
             guard: Callable[[], bool] | None = None) -> None:
    if guard is not None and not guard():
        warnings.warn(f"not freeing {what}: its RPC server is gone", GGMLWarning, stacklevel=1)
        return
    try:
        free(raw)
    except Exception as e:  # never raise from a finalizer
        warnings.warn(f"freeing {what} failed: {e!r}", GGMLWarning, stacklevel=1)


_Step = Callable[[], Any]


class Owned:
    """Base of objects that own a ggml handle."""

    _kind = "object"
    #: close() frees the handle; False: the handle is freed when the object is collected, so
    #: a stale read through a closed object reads its own records, never memory handed on
    _frees_at_close = True
    #: close() takes the parents' locks before its own (a buffer of a context: a thread
    #: setting or computing on that context's tensors holds the context's lock)
    _close_under_parents = False
    _closing = False       # in close(): a close reached again from its own steps returns
    # (fn, after_free) given to on_close, in order; a bound method of the object held weakly
    _steps: "list[tuple[_Step | weakref.WeakMethod[_Step], bool]] | None" = None

    def __init__(self, raw: Any, free: Callable[[Any], Any], *, parents: Iterable[Any] = (),
                 guard: Callable[[], bool] | None = None) -> None:
        self._raw = raw
        self._parents = tuple(p for p in parents if isinstance(p, Owned))  # strong references
        self._children: weakref.WeakSet[Owned] = weakref.WeakSet()
        # held while the handle is in use (a call into ggml, a close): `lock` is what other
        # objects hold to keep this one from closing under them (an attribute, not a
        # property: transfers take it on every call); `_lock` names it in the class's own code
        self.lock = self._lock = threading.RLock()
        # `guard` (optional) says whether freeing is still safe: ggml's RPC client aborts the
        # process when it frees remote memory of a server that has died.
        self._finalizer = finalize(self, _release, free, raw, self._kind, guard)
        self._exports: "weakref.WeakSet[Export]" = weakref.WeakSet()   # live exports of it
        LIVE.add(self)
        for p in self._parents:
            p._children.add(self)

    @property
    def ptr(self) -> Any:
        """The raw cffi handle; raises :class:`ClosedError` once closed."""
        if self._raw is None:
            raise ClosedError(f"this {self._kind} is closed")
        for p in self._parents:
            if p._raw is None:
                raise ClosedError(f"this {self._kind}'s {p._kind} is closed")
        return self._raw

    @property
    def closed(self) -> bool:
        return self._raw is None

    def on_close(self, fn: _Step, *, after_free: bool = False) -> None:
        """Call `fn()` when this object closes: before its children close and its handle is
        freed (the steps run in the order given), or with `after_free`, once the handle is
        freed, outside the object's lock (what it used and closes after itself). A step
        that raises leaves the object open, to be closed again."""
        if getattr(fn, "__self__", None) is self:     # (held strongly: the object a cycle)
            fn = weakref.WeakMethod(fn)
        if self._steps is None:
            self._steps = []
        self._steps.append((fn, after_free))

    def close(self) -> None:
        """Free the handle now. Idempotent; the steps given to :meth:`on_close` run first,
        then the children still open are closed. Waits for a use of the object in another
        thread to finish. Memory that a live zero-copy export reads is left to it."""
        if self._close_under_parents and self._parents:
            with contextlib.ExitStack() as locks:
                for p in self._parents:
                    locks.enter_context(p.lock)
                with self._lock:
                    after = self._close_locked()
        else:
            with self._lock:
                after = self._close_locked()
        for fn in after:
            _call(fn)

    def _close_locked(self) -> list[Any]:
        """close() under the locks; returns its after_free steps (none when it did not close)."""
        if self._raw is None or self._closing:
            return []
        steps = tuple(self._steps or ())
        self._closing = True
        try:
            for fn, after in steps:
                if not after:
                    _call(fn)
            for child in list(self._children):
                child.close()
            changed()
            self._raw = None
        finally:
            self._closing = False
        if self._frees_at_close:
            self._free()
        return [fn for fn, after in steps if after]

    def _free(self) -> None:
        """The one place a close frees: now, or, while exports of the memory live, when the
        last of them is collected."""
        exports = list(self._exports)
        if not exports:
            free_now(self._finalizer)
            return
        heir = _Heir()
        if hand_to(self._finalizer, heir):
            for export in exports:
                export._holds.append(heir)

    def _devices(self) -> set[Any]:
        """Raw device handles this object depends on (for closing it with its RPC server)."""
        return set()

    def _forked(self) -> None:
        """Called in a forked child for every object alive at the fork (see
        THREADS_AFTER_FORK); nothing by default."""

    def __enter__(self: _O) -> _O:
        self.ptr  # refuse to enter a closed object
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __copy__(self) -> Any:
        raise TypeError(f"a {self._kind} owns a ggml handle and cannot be copied")

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError(f"a {self._kind} owns a ggml handle and cannot be copied")

    def __reduce__(self) -> Any:
        raise TypeError(f"a {self._kind} owns a ggml handle and cannot be pickled")


def _call(fn: Any) -> None:
    if isinstance(fn, weakref.WeakMethod):
        fn = fn()
    if fn is not None:
        fn()


class _Heir:
    """Holds the free of a closed object's handle until the last export of its memory is
    collected (each export holds it)."""

    __slots__ = ("__weakref__", "finalizer")

    finalizer: "weakref.finalize[Any, Any]"


class Export:
    """The token of a zero-copy export (a numpy view, a DLPack capsule) of memory that owned
    objects free; the export holds it for as long as it reads the memory. While it lives,
    closing one of those owners leaves the memory to it (:meth:`Owned._free`), and it holds
    the owners, so collection cannot free the memory under it either."""

    __slots__ = ("__weakref__", "_holds")

    def __init__(self, owners: Iterable[Any]) -> None:
        self._holds: list[Any] = []            # the owners, then the heirs of their frees
        for o in owners:
            if isinstance(o, Owned) and not o.closed:
                o._exports.add(self)
                self._holds.append(o)


class Borrowed:
    """A handle that belongs to ggml (registry, device, buffer type): never freed here;
    equal when the handles are."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: Any) -> None:
        self.ptr = ptr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Borrowed) and type(other) is type(self) and bool(self.ptr == other.ptr)

    def __hash__(self) -> int:
        return hash(int(ffi.cast("uintptr_t", self.ptr)))

    def __copy__(self) -> Any:
        return self                 # the same ggml object: nothing to copy

    def __deepcopy__(self, memo: Any) -> Any:
        return self

    def __reduce__(self) -> Any:
        raise TypeError(f"a {type(self).__name__} is a handle of this process and cannot be pickled")


class Placer:
    """What a Context asks of an object that placed memory for its tensors and that the
    context keeps (``Context.keep``): a Graph whose allocator placed its nodes, a Scheduler.
    The context asks it, never its private attributes, for the memory it placed (to hand to
    zero-copy exports that outlive ``close()``) and tells it when the context closes."""

    def placed_memory(self) -> Iterable[Owned]:
        """The owners of the memory this placer allocated for tensors (none by default)."""
        return ()

    def context_closing(self) -> None:
        """Called by a context it placed tensors for, as that context closes (nothing by
        default)."""
