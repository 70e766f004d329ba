"""GGUFFile.load: tensors onto a backend; copied by default (read with pread, so a file
changed under it raises instead of faulting), on a private mapping of the file when asked."""
from __future__ import annotations

import mmap
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, cast

import numpy as np

from ._loader import ffi, lib
from .errors import GGMLError, InvalidArgument, NotFound
from ._written import wrote

if TYPE_CHECKING:
    from ._device import BufferType, Device
    from ._interfaces import DeviceLike
    from ._tensor import Tensor
    from .gguf import GGUFFile, TensorInfo

Progress = Callable[[int, int], None]

CHUNK = 64 << 20          # bytes per upload step
AUTO_PROGRESS = 256 << 20  # "auto" prints for uploads at least this large


def _buffer_type(target: Any) -> "tuple[BufferType, DeviceLike | None]":
    """(buffer type, device) of a load target. The device is found from the target, as
    ggml's CPU buffer type names no device."""
    import ggml_py as gg
    if isinstance(target, gg.Backend):
        # the backend's default buffer type, never an extra one (CPU_REPACK): a load picks
        # no buffer type of its own accord
        return gg.BufferType(lib.ggml_backend_get_default_buffer_type(target.ptr)), target.device
    if isinstance(target, gg.Device):
        return target.buffer_type, target
    if isinstance(target, gg.BufferType):
        dev = target.device
        if dev is None and target == gg.device("CPU").buffer_type:
            dev = gg.device("CPU")
        return target, dev
    raise InvalidArgument(f"load() takes a Backend, Device or BufferType, not {type(target).__name__}")


def _zero_copy(f: "GGUFFile", buft: "BufferType", dev: "DeviceLike | None",
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
    next(iter(tensors.values())).ctx.own(buf)   # the tensors' context owns the mapping
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
         progress: Any, copy: bool = True) -> "dict[str, Tensor]":
    import ggml_py as gg
    buft, dev = _buffer_type(target)
    infos = _selected(f, names)
    if not infos:
        return {}
    f._unchanged()
    ctx = gg.Context(capacity=len(infos) + 1)
    try:
        tensors: dict[str, Tensor] = {}
        for ti in infos:
            t = tensors[ti.name] = ctx.tensor(gg.TYPES[ti.type], ti.shape or (1,))
            # the name as the file has it (not always valid UTF-8; shorter than GGML_MAX_NAME)
            lib.ggml_set_name(t.ptr, ti.name.encode("utf-8", "surrogateescape"))
        if not copy and _zero_copy(f, buft, dev, infos, tensors):
            for t in tensors.values():
                wrote(t)                  # the file's bytes, mapped
        else:
            ctx.alloc(buft)
            _copy_in(f, buft, dev, infos, tensors, progress)
    except BaseException:
        ctx.close()
        raise
    return tensors


def _selected(f: "GGUFFile", names: Iterable[str] | None) -> list[Any]:
    """The tensor infos of `names` (all by default, each once, in the order given);
    NotFound for a name the file lacks, InvalidArgument for a tensor without elements."""
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
    for ti in infos:
        if 0 in ti.shape:
            raise InvalidArgument(f"{f.path}: tensor {ti.name!r} has no elements {ti.shape}; "
                                  "ggml_py tensors have at least one")
    return infos


def _copy_in(f: "GGUFFile", buft: Any, dev: Any, infos: list[Any],
             tensors: "dict[str, Tensor]", progress: Any) -> None:
    """The file's bytes of `infos` into their allocated `tensors`, reporting to `progress`."""
    total = sum(ti.nbytes for ti in infos)
    report, done = _reporter(progress, f.path, total), 0
    # a buffer type other than the device's own (an extra one, such as CPU_REPACK)
    # gets each tensor in one piece: such buffers may take no partial writes
    own = dev is not None and buft == dev.buffer_type
    step = CHUNK if own else 1 << 62
    # the device's own host memory takes the file's bytes directly (one copy); other
    # memory through a chunk and Tensor.set
    direct = own and buft.is_host
    chunk = None if direct else np.empty(min(max(ti.nbytes for ti in infos), step), np.uint8)
    for ti in infos:
        t = tensors[ti.name]
        for o in range(0, ti.nbytes, step):
            n = min(step, ti.nbytes - o)
            if chunk is None:
                into = np.frombuffer(ffi.buffer(ffi.cast("char *", t.data) + o, n), np.uint8)
                f._read_into(into, ti.offset + o)     # pread: no mapping to fault
            else:
                f._read_into(chunk[:n], ti.offset + o)
                t.set(chunk[:n], o, flat=True)
            done += n
            if report is not None:
                report(done, total)
        wrote(t)                          # (the direct reads bypass set)
