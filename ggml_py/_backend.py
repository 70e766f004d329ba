"""Backends (owned): a stream/queue on a device that computes graphs and moves data.

    >>> be = gg.device("CPU").backend()          # doctest: +SKIP
    >>> be.set_async(t, host_array)     # host_array is kept alive until be.synchronize()
    >>> be.compute(graph); be.synchronize()

A backend keeps its own books: what queued work still uses (:meth:`keep_until_synchronized`)
and whether its RPC server is alive (:meth:`ensure_alive`). Work on one backend from several
threads is serialized by the backend's lock; close() waits for it.
"""
from __future__ import annotations

import builtins
import os
from typing import Any

import numpy as np

from . import _transfer
from . import _handle
from ._handle import Owned
from ._interfaces import BufferTypeLike, Computable, DeviceLike, Queue, TensorLike, Waitable
from ._rpc_liveness import ensure_alive, free_guard, supports_op
from ._loader import cstr, ffi, lib
from .errors import check_ptr, InvalidArgument, InvalidType, UnsupportedError, require


#: the most threads a CPU-type backend takes (ggml's GGML_MAX_N_THREADS)
MAX_THREADS = int(lib.GGML_MAX_N_THREADS)


def check_n_threads(n: Any, what: str = "n_threads") -> int:
    """The one rule for a thread count, wherever one is given (``Device.backend(n_threads=)``,
    ``Backend.n_threads``, ``rpc.serve(threads=)``, the rpc-server's ``--threads``): an int (a
    numpy integer too, never a bool) in 1..MAX_THREADS. Returns it as an int; raises
    InvalidArgument naming `what` otherwise."""
    require(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 1 <= int(n) <= MAX_THREADS,
            f"{what} must be an int in 1..{MAX_THREADS}, got {n!r}")
    return int(n)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _named_after(name: str, device: str) -> str:
    """A backend's name starts with its device's: ggml's RPC backend is named after the
    device's index on its server ("RPC0[host:port]" for the device RPC1), so that part is
    the device's name here ("RPC1[host:port]")."""
    if name == device or name.startswith(device + "["):
        return name
    bracket = name.find("[")
    return device + (name[bracket:] if bracket >= 0 else "")


class Backend(Owned, Queue):
    """``ggml_backend_t``. Owned: close() or use ``with``. Keeps what async calls use alive
    (host arrays, tensors, graphs) until :meth:`synchronize`."""

    _kind = "backend"

    def __init__(self, raw: Any, device: DeviceLike) -> None:
        self._guard = free_guard(device.ptr)
        super().__init__(raw, lib.ggml_backend_free, guard=self._guard)
        self._device = device
        self._pending: list[object] = []
        self._n_threads: int | None = None
        self._name = _named_after(cstr(lib.ggml_backend_name(raw)) or "", device.name)
        self.on_close(self._finish_queue)

    @classmethod
    def _create(cls, device: DeviceLike, *, n_threads: int | None = None,
                params: str | None = None) -> "Backend":
        require(params is None or isinstance(params, str),
                f"backend: params must be a str, not {type(params).__name__}", InvalidType)
        if params is not None:
            require("\0" not in params, "backend: params must not contain NUL characters")
        if n_threads is not None:
            n_threads = check_n_threads(n_threads)    # (refused before a backend is started)
        raw = check_ptr(lib.ggml_backend_dev_init(device.ptr, params.encode() if params else ffi.NULL),
                        f"could not start a backend on {device.name}")
        be = cls(raw, device)
        if n_threads is not None or device.type == "cpu":
            be.n_threads = n_threads if n_threads is not None else usable_cores()
        return be

    @property
    def name(self) -> str:
        """The backend's name, after its device's ("CPU", "RPC1[host:port]")."""
        self.ptr
        return self._name

    @property
    def device(self) -> DeviceLike:
        """The Device this backend runs on."""
        self.ptr
        return self._device

    @property
    def default_buffer_type(self) -> BufferTypeLike:
        """The buffer type of this backend's device (ggml's default for the backend)."""
        self.ptr
        return self._device.buffer_type

    @property
    def n_threads(self) -> int | None:
        """Threads of CPU-type backends (None where the backend has no such setting)."""
        self.ptr
        return self._n_threads

    @n_threads.setter
    def n_threads(self, n: int) -> None:
        n = check_n_threads(n)
        fn = self._device.registry.proc_address("ggml_backend_set_n_threads",
                                                "ggml_backend_set_n_threads_t")
        require(fn is not None, f"backend {self.name} has no thread count to set",
                UnsupportedError)
        if _handle.THREADS_AFTER_FORK is not None:    # a forked child: see _handle
            n = min(n, _handle.THREADS_AFTER_FORK)
        with self._lock:
            fn(self.ptr, n)
        self._n_threads = n

    def _forked(self) -> None:
        """In a forked child (``_handle._after_fork``): one thread from now on."""
        # (not under the lock: a thread of the parent may have held it at the fork)
        if self._n_threads is not None and self._raw is not None:
            fn = self._device.registry.proc_address("ggml_backend_set_n_threads",
                                                    "ggml_backend_set_n_threads_t")
            if fn is not None:
                fn(self._raw, 1)
                self._n_threads = 1

    # -- books ------------------------------------------------------------------------------
    def keep_until_synchronized(self, obj: object) -> None:
        """Keep `obj` (a host array, a tensor, a graph, an event) alive until the next
        :meth:`synchronize`: queued work on this backend may still use it."""
        self._pending.append(obj)

    def ensure_alive(self) -> None:
        """ClosedError once closed; RPCError instead of ggml's abort when this backend's RPC
        server is gone."""
        self.ptr
        if self._guard is not None:
            ensure_alive(self._device.ptr)

    def synchronize(self) -> None:
        """Wait for everything queued on this backend; then releases what async calls kept."""
        with self._lock:
            self.ensure_alive()
            lib.ggml_backend_synchronize(self.ptr)
            self._pending.clear()

    def supports_op(self, tensor: TensorLike) -> bool:
        """Whether this backend can compute `tensor`'s op with its operands' types and shapes
        (``ggml_backend_supports_op``)."""
        return supports_op(lib.ggml_backend_get_device(self.ptr), tensor.ptr)

    def supports_buffer_type(self, buft: BufferTypeLike) -> bool:
        """Whether this backend can use memory of buffer type `buft`
        (``ggml_backend_supports_buft``)."""
        return bool(lib.ggml_backend_supports_buft(self.ptr, buft.ptr))

    # -- data --------------------------------------------------------------------------------
    def set(self, tensor: TensorLike, array: Any, offset: int = 0) -> None:  # noqa: A003
        """Blocking copy of `array` into `tensor`."""
        self.ensure_alive()
        _transfer.blocking_set(tensor, array, offset)

    def get(self, tensor: TensorLike, out: Any = None, offset: int = 0) -> np.ndarray:
        """Blocking copy of `tensor` into `out` (a new array when None)."""
        self.ensure_alive()
        if out is None:
            return tensor.numpy(copy=True)
        return _transfer.blocking_get(tensor, out, offset)

    def set_async(self, tensor: TensorLike, array: Any, offset: int = 0, *,
                  flat: bool = False) -> None:
        """Queue a copy of `array` into `tensor`; `array` is kept alive until synchronize().
        The array has the tensor's shape, or `flat=True` writes its elements (or raw uint8
        bytes) in memory order at byte `offset`."""
        _transfer.set_async(self, tensor, array, offset, flat)

    def get_async(self, tensor: TensorLike, out: Any, offset: int = 0) -> np.ndarray:
        """Queue a copy of `tensor` into `out`; valid after synchronize()."""
        return _transfer.get_async(self, tensor, out, offset)

    # -- events and graphs -------------------------------------------------------------------
    def wait(self, event: Waitable) -> None:
        """Make work queued on this backend after now wait for `event`."""
        require(isinstance(event, Waitable),      # the argument's kind first, then the caps
                f"wait: expected an Event, not {type(event).__name__}", InvalidType)
        self._device.require_events()
        require(event.device.registry == self._device.registry,
                f"backend {self.name} cannot wait on an event of {event.device.name} "
                "(another kind of backend)")
        with self._lock:
            self.ensure_alive()
            lib.ggml_backend_event_wait(self.ptr, event.ptr)
            event.add_waiter(self)
            self.keep_until_synchronized(event)  # not collected while this queue may wait on it

    def compute(self, graph: Computable) -> None:
        """Compute `graph` and wait for it."""
        if not isinstance(graph, Computable):      # (no call more on the recompute path)
            raise InvalidArgument(f"compute: expected a gg.Graph, not {type(graph).__name__}")
        graph.compute_on(self, asynchronous=False)

    def can_free(self) -> bool:
        """Whether freeing memory through this backend's device is safe: ggml's RPC client
        aborts the process when it frees memory of a server that has died."""
        return self._guard is None or self._guard()

    def compute_async(self, graph: Computable) -> None:
        """Queue `graph`; results are valid after synchronize()."""
        _graph_of(graph).compute_on(self, asynchronous=True)

    def _devices(self) -> "builtins.set[Any]":
        return {self._device.ptr}

    def _finish_queue(self) -> None:
        """The first step of close(): wait for the work queued here, since nothing queued may
        outlive its memory (not on a dead RPC server: that would abort)."""
        if self.can_free():
            lib.ggml_backend_synchronize(self._raw)
            self._pending.clear()

    def __repr__(self) -> str:
        return "<Backend closed>" if self.closed else f"<Backend {self._name} on {self._device.name}>"


def _graph_of(graph: Any) -> Computable:
    if not isinstance(graph, Computable):
        raise InvalidArgument(f"compute: expected a gg.Graph, not {type(graph).__name__}")
    return graph


__all__ = ["Backend", "usable_cores"]
