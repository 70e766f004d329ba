"""The package's one way to free C memory when a Python object dies: :func:`finalize`.

It is ``weakref.finalize`` with the order of a cyclic collection fixed. The collector calls
the weakref callbacks of its garbage (the finalizers) before the ``__del__`` methods of the
same garbage, so a ``__del__`` that reads a tensor of its cycle would read memory freed an
instant earlier. Here a free asked for during a collection waits in a queue until the
collection ends, and is dropped (re-armed) while a ``__del__`` has brought its object back to
life. Frees do not run at interpreter exit, except the stopping of child processes.

Every finalizer of ggml_py is made here (``tests/test_lifetime.py`` checks that no other
module calls ``weakref.finalize``).
"""
from __future__ import annotations

import collections
import gc
import os
import warnings
import weakref
from typing import Any, Callable

from .errors import GGMLWarning

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


def _after_fork() -> None:
    global _collecting
    # a fork from another thread during a collection: the child's collector never reaches
    # "stop", and every free would queue
    _collecting = False


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


def hand_to(finalizer: "weakref.finalize[Any, Any]", heir: Any) -> bool:
    """Move the free of `finalizer` (made by :func:`finalize`) to `heir`: it runs when `heir`
    is collected instead. False when it had run or moved already."""
    info = detach(finalizer)
    if info is None:
        return False
    _, _, fn, *args = info[2]
    heir.finalizer = finalize(heir, fn, *args)
    return True


__all__ = ["finalize", "detach", "free_now", "hand_to"]
