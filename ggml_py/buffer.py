"""Buffer types (borrowed) and buffers (owned): ``ggml_backend_buft_*``, ``ggml_backend_buffer_*``.

    >>> buft = gg.device("CPU").buffer_type      # doctest: +SKIP
    >>> with buft.alloc(1 << 20) as buf:
    ...     buf.clear(0)
"""
from __future__ import annotations

import numpy as np

from ._handle import Borrowed, Owned
from ._loader import cstr, ffi, lib
from .errors import GGMLError, InvalidArgument, UnsupportedError, require
from .registry import ensure_alive, free_guard

_USAGE = {"any": lib.GGML_BACKEND_BUFFER_USAGE_ANY,
          "weights": lib.GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
          "compute": lib.GGML_BACKEND_BUFFER_USAGE_COMPUTE}


class OutOfMemory(GGMLError, MemoryError):
    """The device could not allocate a buffer."""


class BufferType(Borrowed):
    """How and where a device allocates memory. Borrowed from ggml."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return cstr(lib.ggml_backend_buft_name(self.ptr))

    @property
    def alignment(self) -> int:
        return int(lib.ggml_backend_buft_get_alignment(self.ptr))

    @property
    def max_size(self) -> int:
        return int(lib.ggml_backend_buft_get_max_size(self.ptr))

    @property
    def is_host(self) -> bool:
        """Whether its memory is plain host memory the CPU can read directly."""
        return bool(lib.ggml_backend_buft_is_host(self.ptr))

    @property
    def device(self):
        from .registry import Device
        p = lib.ggml_backend_buft_get_device(self.ptr)
        return None if p == ffi.NULL else Device._of(p)

    def alloc_size(self, tensor) -> int:
        """Bytes a buffer of this type needs for `tensor` (padding included)."""
        return int(lib.ggml_backend_buft_get_alloc_size(self.ptr, tensor.ptr))

    def alloc(self, nbytes: int) -> "Buffer":
        """A new buffer of `nbytes` bytes (:class:`OutOfMemory` when the device refuses)."""
        require(isinstance(nbytes, (int, np.integer)) and not isinstance(nbytes, bool),
                f"nbytes must be an int, not {type(nbytes).__name__}")
        require(nbytes >= 0, f"nbytes must be >= 0, got {nbytes}")
        require(nbytes <= self.max_size,
                f"{nbytes} bytes exceed buffer type {self.name}'s max size {self.max_size}")
        ensure_alive(lib.ggml_backend_buft_get_device(self.ptr))
        raw = lib.ggml_backend_buft_alloc_buffer(self.ptr, int(nbytes))
        if raw == ffi.NULL:
            raise OutOfMemory(f"{self.name} could not allocate {nbytes} bytes")
        return Buffer(raw)

    def __repr__(self):
        return f"<BufferType {self.name} align={self.alignment} host={self.is_host}>"


class Buffer(Owned):
    """Device memory (``ggml_backend_buffer_t``). Owned: close() or use ``with``."""

    _kind = "buffer"

    def __init__(self, raw, *, keep=None, parents=()):
        dev = lib.ggml_backend_buft_get_device(lib.ggml_backend_buffer_get_type(raw))
        self._dev = None if dev == ffi.NULL else dev
        super().__init__(raw, lib.ggml_backend_buffer_free, parents=parents, guard=free_guard(self._dev))
        self._keep = keep  # host memory a zero-copy buffer stands on

    def _devices(self) -> set:
        return {self._dev} if self._dev is not None else set()

    @classmethod
    def _from_host(cls, device, array) -> "Buffer":
        require(device.caps.buffer_from_host_ptr,
                f"device {device.name} cannot make buffers from host memory", UnsupportedError)
        require(isinstance(array, np.ndarray), "buffer_from_host needs a numpy array")
        require(array.flags.c_contiguous, "buffer_from_host needs a C-contiguous array")
        require(array.nbytes > 0, "buffer_from_host needs a non-empty array")
        align = device.buffer_type.alignment
        addr = array.ctypes.data
        require(addr % align == 0,
                f"the array's memory at {addr:#x} is not aligned to {align} bytes as "
                f"{device.name} requires; allocate it with gg.aligned_empty()")
        ptr = ffi.cast("void *", addr)
        raw = lib.ggml_backend_dev_buffer_from_host_ptr(device.ptr, ptr, array.nbytes, array.nbytes)
        if raw == ffi.NULL:
            raise GGMLError(f"{device.name} refused a buffer over host memory")
        return cls(raw, keep=array)

    @property
    def size(self) -> int:
        return int(lib.ggml_backend_buffer_get_size(self.ptr))

    @property
    def base(self) -> int:
        """Address of the buffer's memory (a device address for device buffers)."""
        return int(ffi.cast("uintptr_t", lib.ggml_backend_buffer_get_base(self.ptr)))

    @property
    def is_host(self) -> bool:
        return bool(lib.ggml_backend_buffer_is_host(self.ptr))

    @property
    def buffer_type(self) -> BufferType:
        return BufferType(lib.ggml_backend_buffer_get_type(self.ptr))

    @property
    def name(self) -> str:
        return cstr(lib.ggml_backend_buffer_name(self.ptr))

    @property
    def usage(self) -> str:
        u = int(lib.ggml_backend_buffer_get_usage(self.ptr))
        return next(k for k, v in _USAGE.items() if v == u)

    @usage.setter
    def usage(self, value: str) -> None:
        require(value in _USAGE, f"usage must be one of {list(_USAGE)}, not {value!r}")
        lib.ggml_backend_buffer_set_usage(self.ptr, _USAGE[value])

    def clear(self, value: int = 0) -> None:
        """Set every byte of the buffer to `value` (0..255)."""
        require(isinstance(value, (int, np.integer)) and 0 <= value <= 255,
                f"clear value must be a byte (0..255), got {value!r}")
        ensure_alive(self._dev)
        if value and self._dev is not None and \
                cstr(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(self._dev))) == "Vulkan":
            # ggml-vulkan (0.25.3) hands the byte to vkCmdFillBuffer as a 32-bit word, so each
            # word becomes (value, 0, 0, 0); write the bytes through a tensor over the buffer
            self._fill_bytes(int(value))
            return
        lib.ggml_backend_buffer_clear(self.ptr, int(value))

    def _fill_bytes(self, value: int) -> None:
        if self.size == 0:
            return
        raw = lib.ggml_init({"mem_size": int(lib.ggml_tensor_overhead()) * 2,
                             "mem_buffer": ffi.NULL, "no_alloc": True})
        try:
            t = lib.ggml_new_tensor_1d(raw, lib.GGML_TYPE_I8, self.size)
            base = lib.ggml_backend_buffer_get_base(self.ptr)
            if lib.ggml_backend_tensor_alloc(self.ptr, t, base) != 0:
                raise GGMLError("could not place a tensor over the buffer to fill it")
            data = np.full(self.size, value, np.uint8)
            lib.ggml_backend_tensor_set(t, ffi.from_buffer("void *", data), 0, self.size)
        finally:
            lib.ggml_free(raw)

    def __repr__(self):
        if self.closed:
            return "<Buffer closed>"
        return f"<Buffer {self.name} {self.size} bytes host={self.is_host}>"


def aligned_empty(shape, dtype=np.float32, alignment: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose memory starts on an `alignment` boundary
    (for :meth:`Device.buffer_from_host`)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + n].view(dtype).reshape(shape)
