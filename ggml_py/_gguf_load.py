"""GGUFFile.load: tensors onto a backend, without a copy where the memory allows."""
from __future__ import annotations

import mmap
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, cast

import numpy as np

from ._loader import ffi, lib
from .errors import ClosedError, GGMLError, InvalidArgument, NotFound
from ._written import wrote

if TYPE_CHECKING:
    from ._device import BufferType, Device
    from ._tensor import Tensor
    from .gguf import GGUFFile, TensorInfo

Progress = Callable[[int, int], None]

CHUNK = 64 << 20          # bytes per upload step
AUTO_PROGRESS = 256 << 20  # "auto" prints for uploads at least this large


def _buffer_type(target: Any) -> "tuple[BufferType, Device | None]":
    """(buffer type, device) of a load target. The device is found from the target, as
    ggml's CPU buffer type names no device."""
    import ggml_py as gg
    if isinstance(target, gg.Backend):
        # a backend's default buffer type is its device's
        return target.device.buffer_type, target.device
    if isinstance(target, gg.Device):
        return target.buffer_type, target
    if isinstance(target, gg.BufferType):
        dev = target.device
        if dev is None and target == gg.device("CPU").buffer_type:
            dev = gg.device("CPU")
        return target, dev
    raise InvalidArgument(f"load() takes a Backend, Device or BufferType, not {type(target).__name__}")


def _zero_copy(f: "GGUFFile", buft: "BufferType", dev: "Device | None",
               infos: "list[TensorInfo]", tensors: "dict[str, Tensor]") -> bool:
    """Place the tensors on the file's mapped pages; False when that is not possible here."""
    if dev is None or not buft.is_host or not dev.caps.buffer_from_host_ptr \
            or buft != dev.buffer_type:
        return False
    align = dev.buffer_type.alignment
    if any(ti.offset % align for ti in infos) or mmap.ALLOCATIONGRANULARITY % align:
        return False
    lo = min(ti.offset for ti in infos)
    hi = max(ti.offset + ti.nbytes for ti in infos)
    if hi <= lo:
        return False
    pages = np.frombuffer(f._private_pages(), dtype=np.uint8, count=hi - lo, offset=lo)
    try:
        buf = dev.buffer_from_host(pages)
    except GGMLError:
        return False
    next(iter(tensors.values())).ctx.adopt(buf)   # the tensors' context keeps the mapping
    base = buf.base
    for ti in infos:
        t = tensors[ti.name]
        addr = ffi.cast("void *", base + ti.offset - lo)
        if lib.ggml_backend_tensor_alloc(buf.ptr, t.ptr, addr) != 0:
            raise GGMLError(f"{f.path}: placing tensor {ti.name!r} on the mapped file failed")
    return True


def _reporter(progress: Any, path: str, total: int) -> Progress | None:
    if callable(progress):
        return cast(Progress, progress)
    if progress is True or (progress == "auto" and total >= AUTO_PROGRESS):
        name = os.path.basename(path)

        def show(done: int, total: int) -> None:
            sys.stderr.write(f"\rloading {name}: {done / 2**20:.0f}/{total / 2**20:.0f} MiB")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        return show
    return None


def load(f: "GGUFFile", target: Any, names: Iterable[str] | None,
         progress: Any) -> "dict[str, Tensor]":
    import ggml_py as gg
    buft, dev = _buffer_type(target)
    by_name = {ti.name: ti for ti in f.tensors}
    if names is None:
        infos = list(f.tensors)
    else:
        if isinstance(names, str):
            raise InvalidArgument("names must be a list of tensor names, not a string")
        names = list(names)
        missing = [n for n in names if n not in by_name]
        if missing:
            raise NotFound(f"{f.path}: no tensor named {missing[0]!r} "
                           f"(the file has {len(by_name)} tensors)")
        infos = [by_name[n] for n in dict.fromkeys(names)]
    if not infos:
        return {}
    for ti in infos:
        if 0 in ti.shape:
            raise InvalidArgument(f"{f.path}: tensor {ti.name!r} has no elements {ti.shape}; "
                                  "ggml_py tensors have at least one")
    f._unchanged()
    mapped = f._map
    if mapped is None:
        raise ClosedError(f"{f.path}: the file is closed")
    ctx = gg.Context(capacity=len(infos) + 1)
    try:
        tensors: dict[str, Tensor] = {}
        for ti in infos:
            t = tensors[ti.name] = ctx.tensor(gg.TYPES[ti.type], ti.shape or (1,))
            # the name as the file has it (not always valid UTF-8; shorter than GGML_MAX_NAME)
            lib.ggml_set_name(t.ptr, ti.name.encode("utf-8", "surrogateescape"))
        if _zero_copy(f, buft, dev, infos, tensors):
            for t in tensors.values():
                wrote(t)                  # the file's bytes, mapped
        else:
            ctx.alloc(buft)
            total = sum(ti.nbytes for ti in infos)
            report, done = _reporter(progress, f.path, total), 0
            for ti in infos:
                t = tensors[ti.name]
                for o in range(0, ti.nbytes, CHUNK):
                    n = min(CHUNK, ti.nbytes - o)
                    t.set(np.frombuffer(mapped, dtype=np.uint8, count=n, offset=ti.offset + o), o,
                          flat=True)
                    done += n
                    if report is not None:
                        report(done, total)
    except BaseException:
        ctx.close()
        raise
    return tensors
