"""Backends (owned): a stream/queue on a device that computes graphs and moves data.

    >>> be = gg.device("CPU").backend()          # doctest: +SKIP
    >>> be.set_async(t, host_array)     # host_array is kept alive until be.synchronize()
    >>> be.compute(graph); be.synchronize()
"""
from __future__ import annotations

from ._handle import Owned
from ._loader import cstr, ffi, lib
from .errors import InvalidArgument, require
from .registry import Device, ensure_alive, free_guard, require_events, usable_cores
from . import transfer


class Backend(Owned):
    """``ggml_backend_t``. Owned: close() or use ``with``. Keeps what async calls use alive
    (host arrays, tensors, graphs) until :meth:`synchronize`."""

    _kind = "backend"

    def __init__(self, raw, device: Device):
        self._guard = free_guard(device.ptr)
        super().__init__(raw, lib.ggml_backend_free, guard=self._guard)
        self._device = device
        self._pending: list = []
        self._n_threads = None

    @classmethod
    def _create(cls, device: Device, *, n_threads=None, params=None) -> "Backend":
        require(params is None or isinstance(params, str), "params must be a str")
        raw = lib.ggml_backend_dev_init(device.ptr, params.encode() if params else ffi.NULL)
        if raw == ffi.NULL:
            from .errors import GGMLError
            raise GGMLError(f"could not start a backend on {device.name}")
        be = cls(raw, device)
        if n_threads is not None or device.type == "cpu":
            be.n_threads = n_threads if n_threads is not None else usable_cores()
        return be

    @property
    def name(self) -> str:
        return cstr(lib.ggml_backend_name(self.ptr))

    @property
    def device(self) -> Device:
        self.ptr
        return self._device

    @property
    def default_buffer_type(self):
        from .buffer import BufferType
        return BufferType(lib.ggml_backend_get_default_buffer_type(self.ptr))

    @property
    def n_threads(self) -> int | None:
        """Threads of CPU-type backends (None where the backend has no such setting)."""
        self.ptr
        return self._n_threads

    @n_threads.setter
    def n_threads(self, n: int) -> None:
        require(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= int(lib.GGML_MAX_N_THREADS),
                f"n_threads must be an int in 1..{int(lib.GGML_MAX_N_THREADS)}, got {n!r}")
        fn = self._device.registry.proc_address("ggml_backend_set_n_threads",
                                                "ggml_backend_set_n_threads_t")
        require(fn is not None, f"backend {self.name} has no thread count to set")
        fn(self.ptr, n)
        self._n_threads = n

    def synchronize(self) -> None:
        """Wait for everything queued on this backend; then releases what async calls kept."""
        self._alive()
        lib.ggml_backend_synchronize(self.ptr)
        self._pending.clear()

    def supports_op(self, tensor) -> bool:
        return bool(lib.ggml_backend_supports_op(self.ptr, tensor.ptr))

    def supports_buffer_type(self, buft) -> bool:
        return bool(lib.ggml_backend_supports_buft(self.ptr, buft.ptr))

    # -- data --------------------------------------------------------------------------------
    def set(self, tensor, array, offset: int = 0) -> None:
        """Blocking copy of `array` into `tensor`."""
        self.ptr
        transfer.blocking_set(tensor, array, offset)

    def get(self, tensor, out=None, offset: int = 0):
        """Blocking copy of `tensor` into `out` (a new array when None)."""
        self.ptr
        if out is None:
            return tensor.numpy(copy=True)
        return transfer.blocking_get(tensor, out, offset)

    def set_async(self, tensor, array, offset: int = 0) -> None:
        """Queue a copy of `array` into `tensor`; `array` is kept alive until synchronize()."""
        transfer.set_async(self, tensor, array, offset)

    def get_async(self, tensor, out, offset: int = 0):
        """Queue a copy of `tensor` into `out`; valid after synchronize()."""
        return transfer.get_async(self, tensor, out, offset)

    # -- events and graphs -------------------------------------------------------------------
    def wait(self, event) -> None:
        """Make work queued on this backend after now wait for `event`."""
        require_events(self._device)
        require(event.device.registry == self._device.registry,
                f"backend {self.name} cannot wait on an event of {event.device.name} "
                "(another kind of backend)")
        self._alive()
        lib.ggml_backend_event_wait(self.ptr, event.ptr)
        event._waiters.add(self)
        self._pending.append(event)    # not collected while this queue may still wait on it

    def compute(self, graph) -> None:
        """Compute `graph` and wait for it."""
        from .graph import compute
        compute(self, graph, asynchronous=False)

    def compute_async(self, graph) -> None:
        """Queue `graph`; results are valid after synchronize()."""
        from .graph import compute
        compute(self, graph, asynchronous=True)

    def _devices(self) -> set:
        return {self._device.ptr}

    def _alive(self) -> None:
        """RPCError instead of ggml's abort when this backend's RPC server is gone."""
        self.ptr                                   # ClosedError first
        if self._guard is not None:
            ensure_alive(self._device.ptr)

    def close(self) -> None:
        if self._raw is not None and (self._guard is None or self._guard()):
            lib.ggml_backend_synchronize(self._raw)  # nothing queued may outlive its memory
            self._pending.clear()
        super().close()

    def __repr__(self):
        return "<Backend closed>" if self.closed else f"<Backend {self.name} on {self._device.name}>"
