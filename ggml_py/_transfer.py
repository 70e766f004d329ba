"""Moving bytes: tensor <-> numpy (blocking and async) and tensor -> tensor across backends.

Every path validates first (ggml aborts the process on out-of-bounds or unallocated tensors).
Async forms keep their host arrays and tensors alive in the backend until it synchronizes.
"""
from __future__ import annotations

import contextlib
import operator
from typing import Any, TypeGuard

import numpy as np

from . import _types
from ._buffer import host_addressable
from ._interfaces import Queue, TensorLike
from ._written import require_written, wrote
from ._loader import HELPERS, ffi, lib
from .errors import InvalidArgument, InvalidType, require


def _holding(backends: tuple[Queue, ...], tensors: tuple[TensorLike, ...]) -> contextlib.ExitStack:
    """The locks of `backends`, then of the tensors' contexts, each group sorted (the order
    compute takes them in): a context or buffer closing in another thread waits until ggml
    is done with the bytes, and two copies in opposite directions cannot deadlock."""
    stack = contextlib.ExitStack()
    for b in sorted({id(b): b for b in backends}.values(), key=id):
        stack.enter_context(b.lock)
    for c in sorted({id(t.ctx): t.ctx for t in tensors}.values(), key=id):
        stack.enter_context(c.lock)
    return stack


def _offset(offset: Any, what: str) -> int:
    try:
        off = operator.index(offset)
    except TypeError:
        raise InvalidType(f"{what}: offset must be an int, not {type(offset).__name__}") from None
    require(off >= 0, f"{what}: offset must be >= 0, got {off}")
    return off


def _host_array(t: TensorLike, array: Any, offset: Any, *, writable: bool,
                what: str, memory: bool = True) -> tuple[np.ndarray, int]:
    """Check `array` against tensor `t`; return (array, byte offset). (Plain ifs: this runs on
    every transfer, and a message is formatted only when a check fails.) `memory=False`: the
    caller checks the tensor's memory itself, under the context's lock."""
    if memory:
        t.require_memory(what)
    else:
        t.ptr
    if not isinstance(array, np.ndarray):
        raise InvalidType(f"{what}: expected a numpy array, got {type(array).__name__}")
    flags = array.flags
    if not flags.c_contiguous:
        raise InvalidArgument(f"{what}: the array is not C-contiguous; pass np.ascontiguousarray(a)")
    if writable and not flags.writeable:
        raise InvalidArgument(f"{what}: the output array is read-only")
    dt = array.dtype
    if dt.hasobject:
        raise InvalidType(f"{what}: object arrays hold no numbers")
    if not t.is_contiguous:
        raise InvalidArgument(f"{what}: tensor {t.name or '(unnamed)'} is a non-contiguous view; "
                              "make a contiguous copy with gg.cont(t) in the graph")
    if type(offset) is not int or offset:
        offset = _offset(offset, what)
    tdt = t.dtype
    if dt is tdt:                 # the usual case (numpy's builtin dtypes are singletons)
        if offset == 0 and array.size != t.size:
            raise InvalidArgument(f"{what}: the array has {array.size} elements, the tensor "
                                  f"{t.size} {t.shape}")
    elif not (dt == np.uint8 and tdt != np.uint8):      # (raw bytes: any type, bounds below)
        if tdt is None:
            raise InvalidType(f"{what}: {t.type.name} tensors take raw bytes (uint8) or, with "
                              "set(), float32 to quantize")
        if dt != tdt:
            raise InvalidType(f"{what}: array dtype {dt} does not match the tensor's {tdt} "
                              f"({t.type.name})")
        if offset == 0 and array.size != t.size:
            raise InvalidArgument(f"{what}: the array has {array.size} elements, the tensor "
                                  f"{t.size} {t.shape}")
    if offset + array.nbytes > t.nbytes:
        raise InvalidArgument(f"{what}: {array.nbytes} bytes at offset {offset} run past the "
                              f"tensor's {t.nbytes} bytes")
    return array, int(offset)


def _whole(array: Any, t: TensorLike, offset: Any, writable: bool) -> "TypeGuard[np.ndarray]":
    """Whether `array` copies into or out of `t` whole, at offset 0: then every check of
    _host_array is known to pass (the usual case, on the hot path of a loop)."""
    whole = t.whole_transfer()
    if whole is None or type(offset) is not int or offset != 0 or type(array) is not np.ndarray:
        return False
    flags = array.flags
    return (array.dtype is whole[0] and array.size == whole[1] and flags.c_contiguous
            and (flags.writeable or not writable))


# a whole host copy in one C call when the tensor has memory on no RPC device (helpers.c;
# None without it): what require_memory checks, asked in C, the copy done there
_COPY: Any = lib.ggml_py_copy if HELPERS else None


def _same_shape(t: TensorLike, array: Any, offset: Any, flat: bool, what: str) -> None:
    """The shape rule of set/set_async: the array has the tensor's shape (numpy order), or
    the caller says `flat=True` (elements in memory order, raw uint8 bytes, an offset)."""
    if not flat and (type(array) is not np.ndarray or array.shape != t.shape or offset):
        # (not an array, or an object array: the transfer's own checks say what is wrong)
        shape = array.shape if isinstance(array, np.ndarray) and not array.dtype.hasobject \
            else None
        if shape is not None and shape == t.shape:
            raise InvalidArgument(f"{what}: an offset writes a flat run; pass flat=True")
        if shape is not None:
            raise InvalidArgument(f"{what}: the array's shape {shape} differs from tensor "
                                  f"{t.name or '(unnamed)'}'s {t.shape}; reshape it, or pass "
                                  "flat=True to write its elements (or raw uint8 bytes) in "
                                  "memory order")


def blocking_set(t: TensorLike, array: Any, offset: Any = 0, flat: bool = False) -> None:
    _same_shape(t, array, offset, flat, "set")
    if _whole(array, t, offset, writable=False):
        with t.ctx.lock:
            buf = ffi.from_buffer("void *", array)
            if _COPY is None or _COPY(t.ptr, buf, array.nbytes, 1) != 0:
                lib.ggml_backend_tensor_set(t.require_memory("set"), buf, 0, array.nbytes)
            wrote(t)
        return
    if (isinstance(array, np.ndarray) and t.dtype is None and array.dtype == np.float32
            and offset == 0 and array.size == t.size):
        array, _ = _types.quantize(array.reshape(-1, t.ne[0]), t.type)  # quantize floats on the way in
    array, offset = _host_array(t, array, offset, writable=False, what="set", memory=False)
    if array.nbytes:
        with t.ctx.lock:
            lib.ggml_backend_tensor_set(t.require_memory("set"), ffi.from_buffer("void *", array),
                                        offset, array.nbytes)
            wrote(t)


def blocking_get(t: TensorLike, out: Any, offset: Any = 0, raw: bool = False) -> np.ndarray:
    if _whole(out, t, offset, writable=True):
        if not raw:
            require_written(t, "get")
        with t.ctx.lock:
            buf = ffi.from_buffer("void *", out, require_writable=True)
            if _COPY is None or _COPY(t.ptr, buf, out.nbytes, 0) != 0:
                lib.ggml_backend_tensor_get(t.require_memory("get"), buf, 0, out.nbytes)
        return out
    out, offset = _host_array(t, out, offset, writable=True, what="get", memory=False)
    if not raw:
        require_written(t, "get")
    if out.nbytes:
        with t.ctx.lock:
            lib.ggml_backend_tensor_get(t.require_memory("get"),
                                        ffi.from_buffer("void *", out, require_writable=True),
                                        offset, out.nbytes)
    result: np.ndarray = out
    return result


class _HostView:
    """Exposes a host tensor's memory to numpy while keeping the tensor's context alive."""

    def __init__(self, t: TensorLike, writable: bool) -> None:
        self.keep = t.ctx.export()   # the memory outlives an explicit ctx.close()
        self.__array_interface__ = {
            "shape": t.shape, "typestr": t.type.numpy_dtype.str if t.type.numpy_dtype else "|u1",
            "version": 3,
            "data": (t.data, not writable),
            "strides": tuple(reversed(t.nb[: t.ndim])),
        }


def to_numpy(t: TensorLike, copy: bool | None, raw: bool = False) -> np.ndarray:
    t.require_memory("numpy()")
    if t.dtype is not None and t.is_host and copy is not True:
        if not raw:
            require_written(t, "numpy()")
        # a view of the buffer: it keeps the tensor's context (and so the buffer) alive; a
        # buffer closed by hand under it marks its tensors unallocated, so copy=False is only
        # offered where the buffer belongs to the context
        return np.asarray(_HostView(t, writable=True))
    require(copy is not False, "numpy(copy=False): this tensor is not plain host memory; "
            "a copy is needed")
    require(t.is_contiguous, "numpy(): the tensor is a non-contiguous view; compute gg.cont(t)")
    if not raw:
        require_written(t, "numpy()")
    if t.dtype is not None:
        return blocking_get(t, np.empty(t.shape, dtype=t.dtype), raw=True)
    data = blocking_get(t, np.empty(t.nbytes, dtype=np.uint8), raw=True)
    return _types.from_float_bytes(t.type, data, t.size).reshape(t.shape)


def _same_device(t: TensorLike, backend: Queue, role: str, *, strict: bool = False) -> None:
    """Refuse a tensor whose buffer belongs to another device than `backend`'s.

    Host buffers pass for copies (every backend's copy path can read them); async set/get
    (`strict`) needs the backend's own memory, as their device code assumes it."""
    buf = t.ptr.buffer
    dev = lib.ggml_backend_buft_get_device(lib.ggml_backend_buffer_get_type(buf))
    be_dev = lib.ggml_backend_get_device(backend.ptr)
    if dev == be_dev:
        return
    if dev == ffi.NULL or lib.ggml_backend_buffer_is_host(buf):
        # CPU memory: fine for the CPU backend, and for copies on any backend
        if not strict or int(lib.ggml_backend_dev_type(be_dev)) == int(lib.GGML_BACKEND_DEVICE_TYPE_CPU):
            return
    raise InvalidArgument(f"{role} tensor {t.name or '(unnamed)'} lives on another device than "
                          f"backend {backend.name}")


def set_async(backend: Queue, t: TensorLike, array: Any, offset: Any = 0,
              flat: bool = False) -> None:
    _same_shape(t, array, offset, flat, "set_async")
    with _holding((backend,), (t,)):     # (checks too: a buffer may close meanwhile)
        array, offset = _host_array(t, array, offset, writable=False, what="set_async")
        _same_device(t, backend, "the", strict=True)
        backend.ensure_alive()
        p = t.ptr
        backend.keep_until_synchronized((t, array))
        if array.nbytes:
            lib.ggml_backend_tensor_set_async(backend.ptr, p, ffi.from_buffer("void *", array),
                                              offset, array.nbytes)
            wrote(t)


def get_async(backend: Queue, t: TensorLike, out: Any, offset: Any = 0) -> np.ndarray:
    with _holding((backend,), (t,)):     # (checks too: a buffer may close meanwhile)
        out, offset = _host_array(t, out, offset, writable=True, what="get_async")
        require_written(t, "get_async")
        _same_device(t, backend, "the", strict=True)
        backend.ensure_alive()
        p = t.ptr
        backend.keep_until_synchronized((t, out))
        if out.nbytes:
            lib.ggml_backend_tensor_get_async(backend.ptr, p,
                                              ffi.from_buffer("void *", out, require_writable=True),
                                              offset, out.nbytes)
    result: np.ndarray = out
    return result


def copy_async(src: TensorLike, dst: TensorLike, src_backend: Queue, dst_backend: Queue) -> None:
    """Copy tensor `src` (on `src_backend`'s device) into `dst` (on `dst_backend`'s device)
    with ``ggml_backend_tensor_copy_async``.

    Where the backends have a native ``cpy_tensor_async`` ggml queues the copy on one of the
    two queues, and which one depends on the backend (0.26.0): CUDA puts it on the
    **source's** stream and makes the destination's wait for it; Vulkan puts it on the
    **destination's** queue; Metal on the source's, behind a marker of the destination's
    queue. The queue it lands on orders that side only, so order both with events: the source's writes before the copy (read after write) and the destination's
    reads of `dst` before it is overwritten (write after read). Read the bytes only after
    synchronizing both backends. Without a native copy (CPU, RPC, two kinds of device), ggml
    synchronizes both backends and copies blocking.

        e0, e1 = dev0.event(), dev1.event()
        e0.record(be0); e1.record(be1)
        be1.wait(e0); be0.wait(e1)
        gg.copy_async(a, b, be0, be1)
        be0.synchronize(); be1.synchronize()
    """
    _tensor(src, "copy_async", "src")
    _tensor(dst, "copy_async", "dst")
    for be, role in ((src_backend, "src_backend"), (dst_backend, "dst_backend")):
        require(isinstance(be, Queue),
                f"copy_async: {role} must be a Backend, not {type(be).__name__}", InvalidType)
    with _holding((src_backend, dst_backend), (src, dst)):   # (a buffer may close meanwhile)
        ps = src.require_memory("copy_async source")
        pd = dst.require_memory("copy_async destination")
        require(src.type == dst.type,
                f"copy_async: types differ ({src.type.name} -> {dst.type.name})", InvalidType)
        require(src.ne == dst.ne, f"copy_async: shapes differ ({src.shape} -> {dst.shape})")
        require(src.nb == dst.nb, "copy_async: layouts differ (strides); copy contiguous tensors")
        require(ps != pd, "copy_async: source and destination are the same tensor")
        _same_device(src, src_backend, "the source")
        _same_device(dst, dst_backend, "the destination")
        src_backend.ensure_alive()
        dst_backend.ensure_alive()
        src_backend.keep_until_synchronized(src)
        dst_backend.keep_until_synchronized((src, dst))
        if _placeholder_source(ps):       # (no backend has a native copy out of meta memory)
            lib.ggml_backend_synchronize(src_backend.ptr)
            lib.ggml_backend_synchronize(dst_backend.ptr)
            _copy_blocking(src, ps, pd)
        else:
            lib.ggml_backend_tensor_copy_async(src_backend.ptr, dst_backend.ptr, ps, pd)
        wrote(dst)


def _tensor(t: Any, what: str, role: str) -> None:
    require(isinstance(t, TensorLike), f"{what}: {role} must be a Tensor, not "
                                          f"{type(t).__name__}", InvalidType)


def copy(src: TensorLike, dst: TensorLike) -> None:
    """Blocking copy between tensors on any devices (``ggml_backend_tensor_copy``)."""
    _tensor(src, "copy", "src")
    _tensor(dst, "copy", "dst")
    with _holding((), (src, dst)):        # (checks too: a buffer may close meanwhile)
        ps, pd = src.require_memory("copy source"), dst.require_memory("copy destination")
        require(src.type == dst.type and src.ne == dst.ne and src.nb == dst.nb,
                f"copy: tensors differ in type or layout ({src.type.name}{src.shape} -> "
                f"{dst.type.name}{dst.shape})")
        require(ps != pd, "copy: source and destination are the same tensor")
        _copy_blocking(src, ps, pd)
        wrote(dst)


def _placeholder_source(ps: Any) -> bool:
    """A source ggml takes for host memory that is not at its address (a meta device's)."""
    return bool(lib.ggml_backend_buffer_is_host(ps.buffer)) and not host_addressable(ps.buffer)


def _copy_blocking(src: TensorLike, ps: Any, pd: Any) -> None:
    """``ggml_backend_tensor_copy``, which reads a host source at its address: a meta
    device's tensor is read through its buffer instead (into the destination's memory when
    that is addressable, else through a host copy)."""
    if not _placeholder_source(ps):
        lib.ggml_backend_tensor_copy(ps, pd)
    elif host_addressable(pd.buffer):
        lib.ggml_backend_tensor_get(ps, pd.data, 0, src.nbytes)
    else:
        tmp = np.empty(src.nbytes, np.uint8)
        p = ffi.from_buffer("void *", tmp, require_writable=True)
        lib.ggml_backend_tensor_get(ps, p, 0, src.nbytes)
        lib.ggml_backend_tensor_set(pd, p, 0, src.nbytes)
