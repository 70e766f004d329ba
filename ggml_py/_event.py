"""Events (owned): ordering work between backends, like CUDA's record/wait/synchronize.

    >>> ev = dev.event()                         # doctest: +SKIP
    >>> ev.record(producer)          # marks the point in producer's queue
    >>> consumer.wait(ev)            # consumer's later work waits for that point
    >>> ev.synchronize()             # the host waits for it

ggml offers nothing more (no query, no timing), and neither does this class.
"""
from __future__ import annotations

import weakref
from typing import Any

from ._backend import Backend
from ._handle import Owned
from ._interfaces import DeviceLike, Queue, Waitable
from ._rpc_liveness import ensure_alive, free_guard
from ._loader import ffi, lib
from .errors import GGMLError, InvalidType, check_ptr, require


class Event(Owned, Waitable):
    """``ggml_backend_event_t`` of one device. Owned: close() or use ``with``."""

    _kind = "event"

    def __init__(self, raw: Any, device: DeviceLike) -> None:
        super().__init__(raw, lib.ggml_backend_event_free, guard=free_guard(device.ptr))
        self._device = device
        self._waiters: weakref.WeakSet[Queue] = weakref.WeakSet()  # queues that wait on it
        self._recorded = False       # whether record() ever queued its signal
        self.on_close(self._finish_waiters)

    @classmethod
    def _create(cls, device: DeviceLike) -> "Event":
        device.require_events()
        raw = check_ptr(lib.ggml_backend_event_new(device.ptr),
                        f"ggml could not create an event on {device.name}")
        return cls(raw, device)

    @property
    def device(self) -> DeviceLike:
        """The Device the event was made for."""
        self.ptr
        return self._device

    def add_waiter(self, queue: Queue) -> None:
        """Note that `queue` waits on this event (close() synchronizes it first)."""
        self._waiters.add(queue)

    def record(self, backend: Backend) -> None:
        """Record the event at the current end of `backend`'s queue (same device only)."""
        require(isinstance(backend, Backend),
                f"record: expected a Backend, not {type(backend).__name__}", InvalidType)
        require(backend.device == self._device,
                f"an event of {self._device.name} cannot be recorded on {backend.device.name}")
        with backend.lock:
            backend.ensure_alive()
            lib.ggml_backend_event_record(self.ptr, backend.ptr)
            self._recorded = True

    @property
    def recorded(self) -> bool:
        """Whether the event was recorded on a backend (synchronize() needs that)."""
        return self._recorded

    def synchronize(self) -> None:
        """Block the host until the recorded work is done. Refused for an event never
        recorded: there is nothing to wait for, and what ggml does then is each backend's
        own (0.26.0's CUDA, Vulkan, Metal and RPC return at once), while Metal aborts the
        process when a synchronize is not signalled within 60 s: a wait that may never be
        signalled must not reach ggml (docs/metal.md)."""
        self.ptr
        if not self._recorded:
            raise GGMLError(f"synchronize: the event on {self._device.name} was never "
                            "recorded; record it on a backend first (event.record(backend))")
        ensure_alive(self._device.ptr)
        lib.ggml_backend_event_synchronize(self.ptr)

    def _finish_waiters(self) -> None:
        """The first step of close(): a queue waiting on a freed event may hang (Vulkan's
        does), so the backends that wait on it are synchronized first."""
        for be in list(self._waiters):
            if not be.closed and be.can_free():
                lib.ggml_backend_synchronize(be.ptr)
        self._waiters = weakref.WeakSet()

    def _devices(self) -> set[Any]:
        return {self._device.ptr}

    def __repr__(self) -> str:
        return "<Event closed>" if self.closed else f"<Event on {self._device.name}>"
