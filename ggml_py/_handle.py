"""Owned handles: idempotent close(), context manager, a finalizer holding only the raw handle.

Borrowed handles (registries, devices, buffer types) belong to ggml and are plain objects.
Owned ones derive from :class:`Owned`. A child keeps its parents alive through ordinary
references; a parent's close() closes the children still open first.

Threads: cffi releases the GIL around every C call, so two Python threads can be inside ggml
at once. Each owned object carries a re-entrant lock (``_lock``); the calls ggml does not
make thread-safe (building tensors in a context, computing or queueing on a backend, freeing)
hold it, and close() takes it, so closing an object another thread is using waits for that
use to end instead of freeing memory under it.

Freeing waits for a running collection to end: the cyclic collector calls weakref callbacks
(the finalizers) before the ``__del__`` methods of the same garbage, so a ``__del__`` that reads a
tensor of its cycle would read memory freed an instant earlier. Every finalizer of the package is made by :func:`finalize`, which frees at once outside a
collection and at its end inside one, and not at interpreter exit.
"""
from __future__ import annotations

import collections
import gc
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, TypeVar

from ._loader import ffi
from .errors import ClosedError, GGMLWarning

LIVE: "weakref.WeakSet[Owned]" = weakref.WeakSet()   # every open owned object

# Bumped by every close and every hand-back of placed memory (see changed()): what was
# checked before (a graph validated for a backend, a scheduler's placement) may point into
# memory that is gone, so it is checked again. Read as ``_handle.EPOCH`` (two bumps racing
# may count once: it changes, which is what counts).
EPOCH = 0


def changed() -> None:
    """Tensors may have lost their memory (a close, a scheduler handing its placement back):
    every graph checks again before its next compute."""
    global EPOCH
    EPOCH += 1

_O = TypeVar("_O", bound="Owned")

_collecting = False                    # the cyclic collector is running (in some thread)
# frees asked for during a collection, run when it ends in the order asked (children closed
# before parents), the processes to stop after them
_later: "collections.deque[tuple[_Token, Callable[..., Any], tuple[Any, ...]]]" = \
    collections.deque()
_later_stops: "collections.deque[tuple[_Token, Callable[..., Any], tuple[Any, ...]]]" = \
    collections.deque()


class _Finalizer(weakref.finalize):  # type: ignore[type-arg]
    # (a _Token refers to it weakly; `rearmed`: the finalizer that took its free over when a
    # __del__ brought its object back to life, kept alive through this one, which the
    # object holds)
    __slots__ = ("__weakref__", "rearmed")

    rearmed: "_Finalizer | None"


class _Token:
    """What a queued free knows of its finalizer: held by the object it watches, so alive at
    the end of a collection only when a ``__del__`` brought that object back to life."""

    __slots__ = ("finalizer",)

    def __init__(self) -> None:
        self.finalizer: "weakref.ref[_Finalizer] | None" = None


def _drain() -> None:
    for queue in (_later, _later_stops):
        while True:
            try:
                token, fn, args = queue.popleft()   # (atomic: two threads draining run each once)
            except IndexError:
                break
            try:
                f = token.finalizer() if token.finalizer is not None else None
                if f is not None:
                    # its object was resurrected (a __del__ stored it): free when it dies
                    f.rearmed = _watch(f, queue, fn, args)
                else:
                    fn(*args)
            except Exception as e:             # never raise from the collector
                try:
                    warnings.warn(f"freeing after a collection failed: {e!r}", GGMLWarning,
                                  stacklevel=1)
                except Exception:              # (warnings turned into errors)
                    pass


def _gc_phase(phase: str, info: dict[str, int]) -> None:
    global _collecting
    _collecting = phase == "start"
    if not _collecting:
        _drain()


gc.callbacks.append(_gc_phase)


# A forked child cannot run ggml's CPU compute on more than one thread: ggml's OpenMP
# runtime (libgomp) has no at-fork handler, and its pool of the parent's threads does not
# exist in the child, which then waits forever. In a child every thread count of ggml_py
# (each CPU backend's, set through Backend.n_threads) is therefore 1: THREADS_AFTER_FORK, and
# the backends alive at the fork are set to it (``Owned._forked``, which Backend overrides).
THREADS_AFTER_FORK: int | None = None


def _after_fork() -> None:
    global _collecting, THREADS_AFTER_FORK
    _collecting = False      # a fork from another thread during a collection: the child's
                             # collector never reaches "stop", and every free would queue
    THREADS_AFTER_FORK = 1
    for obj in list(LIVE):
        try:
            obj._forked()
        except Exception:    # (closed meanwhile: nothing to set)
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _free(queue: Any, token: _Token, fn: Callable[..., Any], *args: Any) -> None:
    if _collecting:
        queue.append((token, fn, args))
        if _collecting:
            return
        _drain()            # the collection ended (and drained) as this was queued
    else:
        fn(*args)


def _watch(obj: Any, queue: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> _Finalizer:
    token = _Token()
    f = _Finalizer(obj, _free, queue, token, fn, *args)
    f.rearmed = None
    token.finalizer = weakref.ref(f)
    f.atexit = queue is _later_stops       # (only process stops run at exit)
    return f


def finalize(obj: Any, fn: Callable[..., Any], *args: Any,
             stops_a_process: bool = False) -> "weakref.finalize[Any, Any]":
    """``weakref.finalize(obj, fn, *args)``, except:

    - when `obj` is collected by the cyclic collector, `fn` runs when the collection ends,
      after the ``__del__`` methods of the same garbage, which may still read what it frees,
      and not at all while a ``__del__`` has brought `obj` back to life (then when it dies);
      for that, `obj` must keep the returned finalizer (as ``_finalizer`` or the like);
    - at interpreter exit it does not run (the process's memory goes with it; freeing
      everything there freed what the last ``__del__`` methods read), unless
      `stops_a_process` (a child process to stop: those run at exit, and after the other
      frees of a collection, which may still talk to it).

    Call :func:`free_now` for an explicit close."""
    return _watch(obj, _later_stops if stops_a_process else _later, fn, args)


def detach(finalizer: "weakref.finalize[Any, Any]") -> Any:
    """``finalizer.detach()`` for a finalizer made by :func:`finalize`, or for the one that took
    its free over when a ``__del__`` brought its object back to life."""
    while isinstance(finalizer, _Finalizer) and finalizer.rearmed is not None:
        finalizer = finalizer.rearmed
    return finalizer.detach()


def free_now(finalizer: "weakref.finalize[Any, Any]") -> None:
    """Run a finalizer made by :func:`finalize` now, even during a collection (an explicit
    close: the object says it is closed from here on, so nothing reads what it frees). Once."""
    info = detach(finalizer)
    if info is not None:
        _, _, fn, *args = info[2]
        fn(*args)


def _release(free: Callable[[Any], Any], raw: Any, what: str,
             guard: Callable[[], bool] | None = None) -> None:
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
        # zero-copy exports (numpy views, DLPack capsules: objects with a ``memory`` list)
        # reading memory this object frees: close() then hands its free to them (hand_over)
        self._exports: "weakref.WeakSet[Any]" = weakref.WeakSet()
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

    def close(self) -> None:
        """Free the handle now. Idempotent; children still open are closed first. Waits for
        a use of the object in another thread to finish."""
        with self._lock:
            if self._raw is None:
                return
            for child in list(self._children):
                child.close()
            changed()
            self._raw = None
            exports = list(self._exports)
            if exports:      # the one rule of every close: live exports keep the memory
                hand_over(self, exports)
            free_now(self._finalizer)

    def export_to(self, token: Any) -> None:
        """Register a zero-copy export `token` (an object with a ``memory`` list) of memory
        this object frees: while it lives, close() leaves that memory to it."""
        self._exports.add(token)
        token.memory.append(self)     # (and collection cannot free it under the token)

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


class _Keeper:
    """Holds the freeing of a closed object's handle until the last export referencing it
    (a numpy view, a DLPack capsule) is collected."""

    __slots__ = ("__weakref__", "finalizer")

    finalizer: "weakref.finalize[Any, Any]"


def hand_over(owned: Owned, tokens: Iterable[Any]) -> None:
    """Move the freeing of `owned`'s handle to the export `tokens` (objects with a ``memory``
    list): close() then leaves the memory to them, and the last one collected frees it."""
    info = detach(owned._finalizer)
    if info is None:
        return
    _, _, fn, *args = info[2]
    keeper = _Keeper()
    keeper.finalizer = finalize(keeper, fn, *args)
    for token in tokens:
        token.memory.append(keeper)


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
