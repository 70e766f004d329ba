"""DLPack both ways: ggml tensors to torch/numpy/cupy without a copy, and host arrays of other
libraries as ggml tensors without a copy.

    >>> torch.from_dlpack(t)          # CPU or CUDA tensor, same memory  # doctest: +SKIP
    >>> gg.from_dlpack(torch_cpu_tensor, ctx)                            # doctest: +SKIP

Out: host tensors (CPU buffers, CUDA's pinned host buffers, Metal's shared buffers) go out as
CPU memory; tensors in a CUDA buffer go out as CUDA memory of their device.
Memory of other devices (RPC, Vulkan) is not addressable by the consumer: BufferError, as the
DLPack protocol asks; ``t.numpy()`` copies instead. The consumer sees the bytes as they are:
ggml's asynchronous work must be finished first (``backend.synchronize()`` after
``compute_async``); ``compute`` is synchronous.

In: only host memory. ggml's CUDA device cannot wrap foreign device memory (its
``buffer_from_host_ptr`` capability is off in every release we pin), so a torch CUDA tensor
cannot become a ggml tensor without a copy; :func:`from_dlpack` says so.
"""
from __future__ import annotations

import ctypes
import gc
import sys
import threading
from typing import TYPE_CHECKING, Any

import cffi
import numpy as np

from . import _written
from ._context import Context
from ._device import device as find_device

if TYPE_CHECKING:
    from ._tensor import Tensor
from ._loader import ffi, lib
from .errors import InvalidArgument, InvalidType, UnsupportedError, check_status, require

KDL_CPU, KDL_CUDA = 1, 2
_INT, _UINT, _FLOAT, _BFLOAT = 0, 1, 2, 4
_CODES = {"f32": (_FLOAT, 32), "f16": (_FLOAT, 16), "f64": (_FLOAT, 64), "bf16": (_BFLOAT, 16),
          "i8": (_INT, 8), "i16": (_INT, 16), "i32": (_INT, 32), "i64": (_INT, 64)}

# The DLPack ABI (dlpack.h, version 0.8 "dltensor" capsules): layout only, no compiler needed.
_dl = cffi.FFI()
_dl.cdef("""
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data; DLDevice device; int32_t ndim; DLDataType dtype;
    int64_t *shape; int64_t *strides; uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor; void *manager_ctx; void (*deleter)(struct DLManagedTensor *);
} DLManagedTensor;
typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
typedef struct DLManagedTensorVersioned {
    DLPackVersion version; void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *); uint64_t flags; DLTensor dl_tensor;
} DLManagedTensorVersioned;
""")

_LIVE: dict[int, tuple[Any, ...]] = {}     # DLManagedTensor address -> what must outlive the consumer


@_dl.callback("void(DLManagedTensor *)")  # type: ignore[untyped-decorator]
def _deleter(managed: Any) -> None:
    _LIVE.pop(int(_dl.cast("uintptr_t", managed)), None)


@_dl.callback("void(DLManagedTensorVersioned *)")  # type: ignore[untyped-decorator]
def _deleter_versioned(managed: Any) -> None:
    _LIVE.pop(int(_dl.cast("uintptr_t", managed)), None)


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


# Capsules are made without a destructor: a consumer that refuses one (numpy and bf16)
# destroys it with its exception set, and Python code run then (a ctypes or cffi callback)
# fails: the export would leak and the consumer's error become a SystemError. Instead this module
# holds each capsule it made and sweeps them in plain Python (at the next export and after
# each collection): a capsule no one else holds any more either was consumed (renamed
# "used_dltensor[_versioned]": the consumer calls the deleter) or not (its export is freed).
_HELD: dict[int, Any] = {}                 # DLManagedTensor address -> its capsule
_SWEEP = threading.Lock()


def _refs_of_unheld() -> int:
    d = {0: _api.PyCapsule_New(1, b"probe", None)}
    return sys.getrefcount(d[0])           # (what the sweep reads for a capsule held here only)


_UNHELD = _refs_of_unheld()


def _sweep() -> None:
    if not _SWEEP.acquire(blocking=False):  # (a collection during a sweep: the next one)
        return
    try:
        for addr in list(_HELD):
            if sys.getrefcount(_HELD[addr]) > _UNHELD:
                continue                         # the consumer (or the user) still holds it
            cap = _HELD.pop(addr)
            for name in (b"dltensor", b"dltensor_versioned"):
                if _api.PyCapsule_IsValid(cap, name):   # never consumed: free its export
                    _LIVE.pop(addr, None)
            del cap
    finally:
        _SWEEP.release()


def _after_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "stop" and _HELD:
        try:
            _sweep()
        except Exception:                        # never raise from the collector
            pass


gc.callbacks.append(_after_collection)


def _cuda_index(t: "Tensor") -> int | None:
    """The CUDA device index of `t`'s buffer, None for other devices."""
    buft = lib.ggml_backend_buffer_get_type(t.ptr.buffer)
    dev = lib.ggml_backend_buft_get_device(buft)
    if dev == ffi.NULL:
        return None
    name = ffi.string(lib.ggml_backend_dev_name(dev)).decode()
    if name.startswith("CUDA") and name[4:].isdigit():
        return int(name[4:])
    return None


def device(t: "Tensor") -> tuple[int, int]:
    """(DLPack device type, index) of tensor `t`'s memory."""
    t.require_memory("__dlpack_device__")
    if t.is_host:
        return (KDL_CPU, 0)
    idx = _cuda_index(t)
    if idx is None:
        raise BufferError(f"tensor {t.name or '(unnamed)'} lives in {t.buffer.name if t.buffer else 'device'} memory, which "
                          "other libraries cannot address; copy it with t.numpy()")
    return (KDL_CUDA, idx)


def capsule(t: "Tensor", max_version: Any = None) -> Any:
    """A DLPack capsule over `t`'s memory (no copy): a versioned one (DLPack 1.0, writable)
    when the consumer accepts it, else a legacy "dltensor" one."""
    kind, idx = device(t)
    code = _CODES.get(t.type.name)
    if code is None:
        raise BufferError(f"DLPack has no type for ggml's {t.type.name}; dequantize it first")
    esize = code[1] // 8
    if any(n % esize for n in t.nb[: t.ndim]):
        raise BufferError("the tensor's strides are not whole elements")
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    if versioned:
        m = _dl.new("DLManagedTensorVersioned *")
        m.version.major, m.version.minor = 1, 0
        m.flags = 0
        m.deleter = _deleter_versioned
    else:
        m = _dl.new("DLManagedTensor *")
        m.deleter = _deleter
    shape = _dl.new("int64_t[]", list(t.shape))
    strides = _dl.new("int64_t[]", [n // esize for n in reversed(t.nb[: t.ndim])])
    dlt = m.dl_tensor
    dlt.data = _dl.cast("void *", t.data)
    dlt.device.device_type, dlt.device.device_id = kind, idx
    dlt.ndim = t.ndim
    dlt.dtype.code, dlt.dtype.bits, dlt.dtype.lanes = code[0], code[1], 1
    dlt.shape, dlt.strides, dlt.byte_offset = shape, strides, 0
    addr = int(_dl.cast("uintptr_t", m))
    _sweep()
    _LIVE[addr] = (m, shape, strides, t.ctx.export())   # the memory outlives ctx.close()
    name = b"dltensor_versioned" if versioned else b"dltensor"
    cap = _api.PyCapsule_New(addr, name, None)
    _HELD[addr] = cap
    return cap


def from_dlpack(obj: Any, ctx: Context, name: str | None = None) -> "Tensor":
    """A tensor of `ctx` over the memory of `obj` (any DLPack producer: numpy, torch, jax...),
    without a copy. The memory must be host memory, C-contiguous and aligned as the CPU
    device requires; `obj` is kept alive with the context."""
    if not hasattr(obj, "__dlpack__"):
        raise InvalidType(f"from_dlpack: expected a DLPack producer (numpy, torch, jax...), "
                          f"not {type(obj).__name__}")
    if not isinstance(ctx, Context):
        raise InvalidType(f"from_dlpack: ctx must be a gg.Context, not {type(ctx).__name__}")
    dev_type = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else KDL_CPU
    if int(dev_type) != KDL_CPU:
        raise UnsupportedError(
            "only host memory can be wrapped: ggml's GPU devices cannot make a buffer over "
            "another library's device memory (no buffer_from_host_ptr); copy it through the "
            "host, e.g. t.set(x.cpu().numpy())")
    try:
        array = np.from_dlpack(obj)
    except (BufferError, TypeError, RuntimeError) as e:
        raise InvalidArgument(f"from_dlpack: {e}") from None
    require(array.flags.c_contiguous, "from_dlpack: the array must be C-contiguous")
    buf = find_device("CPU").buffer_from_host(array)
    t = ctx.tensor(array.dtype, array.shape, name)
    check_status(lib.ggml_backend_tensor_alloc(buf.ptr, t.ptr, ffi.cast("void *", buf.base)),
          "tensor alloc")
    ctx.own(buf)
    _written.wrote(t)                     # the array's values, shared
    return t

__all__ = ["from_dlpack", "device", "capsule"]


def __dir__() -> list[str]:       # dir() and help() show the module's API only
    return sorted(__all__)
