"""Buffers (owned): device memory, ``ggml_backend_buffer_*``.

    >>> buft = gg.device("CPU").buffer_type      # doctest: +SKIP
    >>> with buft.alloc(1 << 20) as buf:
    ...     buf.clear(0)

A buffer is made by its :class:`~ggml_py.BufferType` (``buft.alloc``), by a context
(``ctx.alloc``) or by a device over host memory (``dev.buffer_from_host``); each passes the
buffer type it used, so this module needs nothing from the device module.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _features
from ._handle import Owned
from ._interfaces import BufferTypeLike
from ._rpc_liveness import ensure_alive, free_guard
from . import _written
from ._loader import cstr, ffi, lib
from .errors import ClosedError, GGMLError, require

_USAGE = {"any": lib.GGML_BACKEND_BUFFER_USAGE_ANY,
          "weights": lib.GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
          "compute": lib.GGML_BACKEND_BUFFER_USAGE_COMPUTE}


_META = int(lib.GGML_BACKEND_DEVICE_TYPE_META) if _features.META_DEVICE else -1


def type_addressable(buft: Any) -> bool:
    """Whether memory of buffer type `buft` is read at its tensors' ``data`` addresses in this
    process. ggml says "host" also for a meta device's buffer type (its parts' memory is host
    memory), whose tensors' ``data`` is a placeholder: reading it, as a numpy view, a file
    read or ggml's own copy of a "host" source does, kills the process. The one rule for
    every such read."""
    if buft == ffi.NULL or not lib.ggml_backend_buft_is_host(buft):
        return False
    if _META < 0:
        return True
    dev = lib.ggml_backend_buft_get_device(buft)
    return dev == ffi.NULL or int(lib.ggml_backend_dev_type(dev)) != _META


def host_addressable(raw: Any) -> bool:
    """:func:`type_addressable` for the buffer `raw` (False for none)."""
    return raw != ffi.NULL and type_addressable(lib.ggml_backend_buffer_get_type(raw))


class Buffer(Owned):
    """Device memory (``ggml_backend_buffer_t``). Owned: close() or use ``with``."""

    _kind = "buffer"
    # the owning context's lock first: a thread setting or computing on tensors of that
    # context holds it, and the memory must not go under it
    _close_under_parents = True

    def __init__(self, raw: Any, buffer_type: BufferTypeLike, *, keep: object = None,
                 parents: tuple[Any, ...] = (), owned: bool = True) -> None:
        dev = lib.ggml_backend_buft_get_device(lib.ggml_backend_buffer_get_type(raw))
        self._dev = None if dev == ffi.NULL else dev
        free = lib.ggml_backend_buffer_free if owned else _borrowed
        super().__init__(raw, free, parents=parents, guard=free_guard(self._dev))
        self._buffer_type = buffer_type
        self._keep = keep  # host memory a zero-copy buffer stands on
        self._is_host = host_addressable(raw)

    def _devices(self) -> set[Any]:
        return {self._dev} if self._dev is not None else set()

    def ensure_alive(self) -> None:
        """ClosedError once closed, RPCError once its RPC server is gone."""
        self.ptr
        ensure_alive(self._dev)

    @property
    def size(self) -> int:
        """The buffer's size in bytes."""
        return int(lib.ggml_backend_buffer_get_size(self.ptr))

    @property
    def base(self) -> int:
        """Address of the buffer's memory (a device address for device buffers)."""
        return int(ffi.cast("uintptr_t", lib.ggml_backend_buffer_get_base(self.ptr)))

    @property
    def is_host(self) -> bool:
        """Whether the buffer is plain host memory the CPU reads directly."""
        self.ptr
        return self._is_host

    @property
    def buffer_type(self) -> BufferTypeLike:
        """The BufferType that made this buffer."""
        self.ptr
        return self._buffer_type

    @property
    def name(self) -> str:
        """The buffer's name, as ggml gives it (its buffer type's)."""
        return cstr(lib.ggml_backend_buffer_name(self.ptr)) or ""

    @property
    def usage(self) -> str:
        """What the buffer holds for ggml's schedulers: "any", "weights" or "compute"."""
        u = int(lib.ggml_backend_buffer_get_usage(self.ptr))
        return next(k for k, v in _USAGE.items() if v == u)

    @usage.setter
    def usage(self, value: str) -> None:
        require(value in _USAGE, f"usage must be one of {list(_USAGE)}, not {value!r}")
        lib.ggml_backend_buffer_set_usage(self.ptr, _USAGE[value])

    def clear(self, value: int = 0) -> None:
        """Set every byte of the buffer to `value` (0..255)."""
        require(isinstance(value, (int, np.integer)) and not isinstance(value, bool)
                and 0 <= value <= 255, f"clear: value must be a byte (0..255), got {value!r}")
        with self._lock:
            self.ensure_alive()
            if value and self._dev is not None and cstr(lib.ggml_backend_reg_name(
                    lib.ggml_backend_dev_backend_reg(self._dev))) == "Vulkan":
                # ggml-vulkan (0.25.3) hands the byte to vkCmdFillBuffer as a 32-bit word, so
                # each word becomes (value, 0, 0, 0); write the bytes through a tensor instead
                self._fill_bytes(int(value))
            else:
                lib.ggml_backend_buffer_clear(self.ptr, int(value))
            _written.cleared(self.ptr)     # its tensors hold values now

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

    def __repr__(self) -> str:
        if self.closed:
            return "<Buffer closed>"
        return f"<Buffer {self.name} {self.size} bytes host={self.is_host}>"

    def _repr_html_(self) -> str:
        try:
            from ._display import buffer_html
        except ImportError:
            return f"<pre>{self!r}</pre>"
        return str(buffer_html(self))


class BorrowedBuffer(Buffer):
    """The buffer holding a tensor, seen through it (``t.buffer``). Its owner (the context's
    buffer, a scheduler, a graph's allocator) frees it, so it is as alive as that tensor's
    hold on it: every use asks the tensor again (ClosedError once the context closed, or the
    tensor no longer has its memory in this buffer), under the context's lock."""

    def __init__(self, raw: Any, buffer_type: BufferTypeLike, tensor: Any) -> None:
        super().__init__(raw, buffer_type, parents=(tensor.ctx,), owned=False)
        self._tensor = tensor

    @property
    def ptr(self) -> Any:
        raw = super().ptr
        if self._tensor.ptr.buffer != raw:
            raise ClosedError("this buffer was freed: the tensor it was taken from no longer "
                              "has memory in it")
        return raw

    @property
    def closed(self) -> bool:
        try:
            self.ptr
        except ClosedError:
            return True
        return False

    def clear(self, value: int = 0) -> None:
        with self._tensor.ctx.lock:      # the owner frees under this lock
            super().clear(value)


def _borrowed(raw: Any) -> None:
    """The free function of a buffer seen through a tensor: ggml's owner frees it."""


def aligned_empty(shape: int | tuple[int, ...], dtype: Any = np.float32,
                  alignment: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose memory starts on an `alignment` boundary
    (for :meth:`Device.buffer_from_host`)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(n + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    out: np.ndarray = raw[start:start + n].view(dt).reshape(shape)
    return out
