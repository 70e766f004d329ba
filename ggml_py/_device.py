"""Registries, devices and buffer types: ``ggml_backend_reg_*``, ``ggml_backend_dev_*``,
``ggml_backend_buft_*``.

All three belong to ggml and live as long as the process; these objects only borrow them.
They refer to each other (a device has buffer types, a buffer type has a device), so they
share this module. What they make (buffers, backends, events) lives in the modules below.

    >>> import ggml_py as gg
    >>> [d.name for d in gg.devices()]            # doctest: +SKIP
    ['CPU']
    >>> cpu = gg.device("CPU"); cpu.caps.events
    False
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ._backend import Backend
from ._buffer import Buffer, type_addressable
from ._event import Event
from ._handle import Borrowed
from ._rpc_liveness import ensure_alive, supports_op
from ._features import old_rpc_api
from ._device_env import check_env
from ._loader import cstr, ffi, lib
from .errors import (GGMLError, check_ptr, InvalidArgument, InvalidType, NotFound, OutOfMemory,
                     UnsupportedError, require)

_TYPES = {}
for _name in ("CPU", "GPU", "IGPU", "ACCEL", "META"):
    _v = getattr(lib, f"GGML_BACKEND_DEVICE_TYPE_{_name}", None)
    if _v is not None:
        _TYPES[int(_v)] = _name.lower()

# the caps are the fields of the release's struct, read from it (a cap a new release adds
# appears without code); "async" is a Python keyword: ``async_``
_CAPS_FIELDS = [n for n, _ in ffi.typeof("struct ggml_backend_dev_caps").fields]

if TYPE_CHECKING:
    class Caps(NamedTuple):
        """What a device can do: every field of the release's ``ggml_backend_dev_caps``."""
        async_: bool
        host_buffer: bool
        buffer_from_host_ptr: bool
        events: bool
        mmap_support: bool      # (0.26.0+)
else:
    Caps = NamedTuple("Caps", [("async_" if n == "async" else n, bool) for n in _CAPS_FIELDS])
    Caps.__doc__ = ("What a device can do: every field of this release's "
                    "``struct ggml_backend_dev_caps`` (``async_`` for ``async``), e.g. "
                    + ", ".join(Caps._fields) + ".")


_CAPS: dict[int, Caps] = {}    # device handle -> caps (devices live as long as the process)
# buffer type handle -> the check its tensors pass before ggml places them (meta devices'
# buffer types: see BufferType.admit); buffer types live as long as the process
_ADMIT: dict[int, Any] = {}


class BufferType(Borrowed):
    """How and where a device allocates memory. Borrowed from ggml."""

    __slots__ = ()

    @property
    def name(self) -> str:
        """The buffer type's name ("CPU", "CUDA0", "RPC0[host:port]"...)."""
        return cstr(lib.ggml_backend_buft_name(self.ptr)) or ""

    @property
    def alignment(self) -> int:
        """Alignment in bytes of the tensors it places."""
        return int(lib.ggml_backend_buft_get_alignment(self.ptr))

    @property
    def max_size(self) -> int:
        """The largest buffer it can allocate, in bytes."""
        return int(lib.ggml_backend_buft_get_max_size(self.ptr))

    @property
    def is_host(self) -> bool:
        """Whether its memory is plain host memory the CPU reads at its tensors' addresses
        (a meta device's is not: ggml calls it host memory, but its addresses are
        placeholders; ``_buffer.type_addressable``)."""
        return type_addressable(self.ptr)

    @property
    def device(self) -> "Device | None":
        """The Device it belongs to (None for a host buffer type of no device)."""
        p = lib.ggml_backend_buft_get_device(self.ptr)
        return None if p == ffi.NULL else Device._of(p)

    @property
    def holds_plain_bytes(self) -> bool:
        """Whether tensors placed here hold ggml's own byte layout, so that they can be set in
        part and read back. False for a device's *extra* buffer types (the CPU's
        ``CPU_REPACK``, AMX, KleidiAI): they rearrange each tensor for their kernels when it
        is written, write whole tensors of the types they repack only, and cannot be read."""
        dev = lib.ggml_backend_buft_get_device(self.ptr)
        if dev == ffi.NULL:
            return True
        d = Device._of(dev)
        return self == d.buffer_type or self == d.host_buffer_type or self not in d.buffer_types

    def require_plain_bytes(self, what: str) -> None:
        """UnsupportedError for a buffer type whose tensors are not plain bytes (see
        :attr:`holds_plain_bytes`): nothing of ggml_py may place tensors there, since every
        read and every partial write of one kills the process."""
        if not self.holds_plain_bytes:
            raise UnsupportedError(
                f"{what}: buffer type {self.name} keeps tensors in its kernels' own layout "
                "(ggml cannot read them back or write them in part); ggml_py places no tensors "
                f"there: use {Device._of(lib.ggml_backend_buft_get_device(self.ptr)).name}'s "
                "default buffer type")

    def alloc_size(self, tensor: Any) -> int:
        """Bytes a buffer of this type needs for `tensor` (padding included)."""
        return int(lib.ggml_backend_buft_get_alloc_size(self.ptr, tensor.ptr))

    def admit(self, tensors: list[Any]) -> None:
        """Called with the tensors a context is about to place in a buffer of this type,
        before ggml sees them: a buffer type that must know them first (a meta device's:
        how each is split) checks them here and raises on what it refuses."""
        hook = _ADMIT.get(int(ffi.cast("uintptr_t", self.ptr)))
        if hook is not None:
            hook(tensors)

    def admit_with(self, check: Any) -> None:
        """Give this buffer type the check of :meth:`admit` (a meta device's: its split)."""
        _ADMIT[int(ffi.cast("uintptr_t", self.ptr))] = check

    @property
    def admits(self) -> bool:
        """Whether :meth:`admit` checks anything for this buffer type."""
        return bool(_ADMIT) and int(ffi.cast("uintptr_t", self.ptr)) in _ADMIT

    def alloc(self, nbytes: int) -> Buffer:
        """A new buffer of `nbytes` bytes (:class:`OutOfMemory` when the device refuses)."""
        require(isinstance(nbytes, (int, np.integer)) and not isinstance(nbytes, bool),
                f"alloc: nbytes must be an int, not {type(nbytes).__name__}", InvalidType)
        n = operator.index(nbytes)
        require(n >= 0, f"alloc: nbytes must be >= 0, got {n}")
        if n > self.max_size:
            raise OutOfMemory(f"alloc: {n} bytes exceed buffer type {self.name}'s max size "
                              f"{self.max_size}")
        self.require_plain_bytes("alloc")
        ensure_alive(lib.ggml_backend_buft_get_device(self.ptr))
        raw = check_ptr(lib.ggml_backend_buft_alloc_buffer(self.ptr, n),
                        f"alloc: {self.name} could not allocate {n} bytes", OutOfMemory)
        return Buffer(raw, self)

    def __repr__(self) -> str:
        return f"<BufferType {self.name} align={self.alignment} host={self.is_host}>"


class Registry(Borrowed):
    """A backend registry (CPU, RPC, CUDA, Metal, Vulkan...). Borrowed from ggml."""

    __slots__ = ()

    @property
    def name(self) -> str:
        """The registry's name ("CPU", "RPC", "CUDA"...)."""
        return cstr(lib.ggml_backend_reg_name(self.ptr)) or ""

    @property
    def devices(self) -> list["Device"]:
        """The registry's devices, in its order."""
        n = lib.ggml_backend_reg_dev_count(self.ptr)
        if n == 0 and old_rpc_api() and self.name == "RPC":
            # ggml 0.9.x's RPC registry enumerates nothing: its devices, one per endpoint, are
            # registered with ggml one by one (rpc.connect); they are those that name it
            return [Device._of(d) for d in (lib.ggml_backend_dev_get(i)
                                            for i in range(lib.ggml_backend_dev_count()))
                    if lib.ggml_backend_dev_backend_reg(d) == self.ptr]
        return [Device._of(lib.ggml_backend_reg_dev_get(self.ptr, i)) for i in range(n)]

    def proc_address(self, name: str, ctype: str | None = None) -> Any:
        """A backend-specific function (``ggml_backend_reg_get_proc_address``), cast to `ctype`
        when given; None when the backend does not offer it."""
        p = lib.ggml_backend_reg_get_proc_address(self.ptr, name.encode())
        if p == ffi.NULL:
            return None
        return ffi.cast(ctype, p) if ctype else p

    @property
    def features(self) -> dict[str, str]:
        """Build features the backend reports (e.g. the CPU's AVX2, FMA), where it reports any."""
        fn = self.proc_address("ggml_backend_get_features", "ggml_backend_get_features_t")
        if fn is None:
            return {}
        out: dict[str, str] = {}
        feats = fn(self.ptr)
        i = 0
        while feats[i].name != ffi.NULL:
            out[cstr(feats[i].name) or ""] = cstr(feats[i].value) or ""
            i += 1
        return out

    def __repr__(self) -> str:
        return f"<Registry {self.name} devices={len(self.devices)}>"


class Device(Borrowed):
    """A device (``ggml_backend_dev_t``). Borrowed from ggml; one object per device."""

    _cache: dict[int, "Device"] = {}
    __slots__ = ("__weakref__",)

    @classmethod
    def _of(cls, ptr: Any) -> "Device":
        key = int(ffi.cast("uintptr_t", ptr))
        dev = cls._cache.get(key)
        if dev is None:
            dev = cls._cache[key] = cls(ptr)
        return dev

    # -- properties -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The device's name ("CPU", "CUDA0", "RPC1"...), unique in the process."""
        return cstr(lib.ggml_backend_dev_name(self.ptr)) or ""

    @property
    def description(self) -> str:
        """ggml's description of the device (a processor name, a GPU model, an endpoint)."""
        return cstr(lib.ggml_backend_dev_description(self.ptr)) or ""

    @property
    def type(self) -> str:
        """'cpu', 'gpu', 'igpu' or 'accel'."""
        t = int(lib.ggml_backend_dev_type(self.ptr))
        return _TYPES.get(t, str(t))

    @property
    def memory(self) -> tuple[int, int]:
        """(free, total) bytes, as the device reports them."""
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        ensure_alive(self.ptr)
        lib.ggml_backend_dev_memory(self.ptr, free, total)
        return int(free[0]), int(total[0])

    @property
    def caps(self) -> Caps:
        """What the device can do; fixed for a device, so asked once (for an RPC device,
        ggml's props query is a round trip to the server)."""
        key = int(ffi.cast("uintptr_t", self.ptr))
        if key not in _CAPS:
            props = ffi.new("struct ggml_backend_dev_props *")
            ensure_alive(self.ptr)
            lib.ggml_backend_dev_get_props(self.ptr, props)
            c = props.caps
            _CAPS[key] = Caps(*(bool(getattr(c, n)) for n in _CAPS_FIELDS))
        return _CAPS[key]

    @property
    def device_id(self) -> str | None:
        """A stable identifier such as a PCI bus id, where the backend gives one."""
        props = ffi.new("struct ggml_backend_dev_props *")
        ensure_alive(self.ptr)
        lib.ggml_backend_dev_get_props(self.ptr, props)
        return cstr(props.device_id) if hasattr(props, "device_id") else None

    @property
    def registry(self) -> Registry:
        """The registry the device belongs to; UnsupportedError for a meta device, which
        belongs to none (ggml aborts when asked for the name of a NULL registry)."""
        reg = lib.ggml_backend_dev_backend_reg(self.ptr)
        if reg == ffi.NULL:
            raise UnsupportedError(f"device {self.name} belongs to no registry (a meta device: "
                                   "its parts do)")
        return Registry(reg)

    @property
    def buffer_type(self) -> BufferType:
        """The device's default buffer type."""
        check_env()
        return BufferType(lib.ggml_backend_dev_buffer_type(self.ptr))

    @property
    def host_buffer_type(self) -> BufferType | None:
        """The pinned host buffer type of the device, or None when it has none."""
        p = lib.ggml_backend_dev_host_buffer_type(self.ptr)
        return None if p == ffi.NULL else BufferType(p)

    @property
    def buffer_types(self) -> list[BufferType]:
        """Default, host and extra buffer types (e.g. the CPU's repack types), without repeats."""
        found = [self.buffer_type]
        if self.host_buffer_type is not None:
            found.append(self.host_buffer_type)
        reg = lib.ggml_backend_dev_backend_reg(self.ptr)
        fn = None if reg == ffi.NULL else Registry(reg).proc_address(
            "ggml_backend_dev_get_extra_bufts", "ggml_backend_dev_get_extra_bufts_t")
        if fn is not None:
            extra = fn(self.ptr)
            i = 0
            while extra != ffi.NULL and extra[i] != ffi.NULL:
                found.append(BufferType(extra[i]))
                i += 1
        unique = []
        for b in found:
            if b not in unique:
                unique.append(b)
        return unique

    # -- what it can do ---------------------------------------------------------------------
    def supports_op(self, tensor: Any) -> bool:
        """Whether the device can compute `tensor`'s op (a node of a graph)."""
        return supports_op(self.ptr, tensor.ptr)

    def supports_buffer_type(self, buft: BufferType) -> bool:
        """Whether the device can use memory of buffer type `buft`."""
        return bool(lib.ggml_backend_dev_supports_buft(self.ptr, buft.ptr))

    def offload_op(self, tensor: Any) -> bool:
        """Whether ggml's scheduler would move `tensor`'s op to this device although its weights
        live elsewhere (``ggml_backend_dev_offload_op``)."""
        return bool(lib.ggml_backend_dev_offload_op(self.ptr, tensor.ptr))

    def require_events(self) -> None:
        """UnsupportedError unless the device has events."""
        if not self.caps.events:
            raise UnsupportedError(f"device {self.name} has no events (its caps: {self.caps})")

    # -- owned things made from it ----------------------------------------------------------
    def backend(self, n_threads: int | None = None, params: str | None = None) -> Backend:
        """A new :class:`Backend` (stream/queue) on this device.

        CPU-type backends use the cores this process may use unless `n_threads` says otherwise.
        """
        check_env()
        ensure_alive(self.ptr)
        return Backend._create(self, n_threads=n_threads, params=params)

    def event(self) -> Event:
        """A new :class:`Event` on this device; :class:`UnsupportedError` when it has none."""
        ensure_alive(self.ptr)
        return Event._create(self)

    def buffer_from_host(self, array: np.ndarray) -> Buffer:
        """A buffer over `array`'s own memory (zero copy); keeps `array` alive. The array must
        be writable (ggml writes through such buffers), C-contiguous and aligned."""
        require(self.caps.buffer_from_host_ptr,
                f"device {self.name} cannot make buffers from host memory", UnsupportedError)
        require(isinstance(array, np.ndarray),
                f"buffer_from_host: expected a numpy array, not {type(array).__name__}",
                InvalidType)
        require(array.flags.c_contiguous, "buffer_from_host: the array must be C-contiguous")
        require(array.flags.writeable, "buffer_from_host: the array is read-only, and ggml "
                                       "writes through the buffer; pass a writable copy")
        require(array.nbytes > 0, "buffer_from_host: the array is empty")
        align = self.buffer_type.alignment
        addr = array.ctypes.data
        require(addr % align == 0,
                f"buffer_from_host: the array's memory at {addr:#x} is not aligned to {align} "
                f"bytes as {self.name} requires; allocate it with gg.aligned_empty()")
        raw = lib.ggml_backend_dev_buffer_from_host_ptr(self.ptr, ffi.cast("void *", addr),
                                                        array.nbytes, array.nbytes)
        if raw == ffi.NULL:
            raise GGMLError(f"{self.name} refused a buffer over host memory")
        return Buffer(raw, BufferType(lib.ggml_backend_buffer_get_type(raw)), keep=array)

    def __repr__(self) -> str:
        return f"<Device {self.name} ({self.type}) {self.description!r}>"

    def _repr_html_(self) -> str:
        try:
            from ._display import device_html
        except ImportError:
            return f"<pre>{self!r}</pre>"
        return str(device_html(self))


class DeviceList(list["Device"]):
    """A list of devices that Jupyter shows as a table."""

    def _repr_html_(self) -> str:
        try:
            from ._display import devices_html
        except ImportError:
            return "<pre>" + "\n".join(repr(d) for d in self) + "</pre>"
        return str(devices_html(self))


def registries() -> list[Registry]:
    """Every backend registry, in ggml's order."""
    check_env()
    return [Registry(lib.ggml_backend_reg_get(i)) for i in range(lib.ggml_backend_reg_count())]


def devices() -> DeviceList:
    """Every device of every registry, in ggml's order (RPC devices once connected)."""
    check_env()
    return DeviceList(Device._of(lib.ggml_backend_dev_get(i))
                      for i in range(lib.ggml_backend_dev_count()))


def device(key: str | int | None = None, *, type: str | None = None) -> Device:
    """Look a device up by name (``"CPU"``, ``"CUDA0"``), index, or ``type="gpu"``.

    Raises :class:`NotFound` (a ``LookupError``) when nothing matches.
    """
    devs = devices()
    if type is not None:
        require(key is None, "give a name/index or a type, not both")
        require(type in ("cpu", "gpu", "igpu", "accel"),
                f"unknown device type {type!r}: use 'cpu', 'gpu', 'igpu' or 'accel'")
        for d in devs:
            if d.type == type:
                return d
        raise NotFound(f"no device of type {type!r}; devices: {[d.name for d in devs]}")
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise InvalidArgument(f"device key must be a name or an index, not {key!r}")
    if isinstance(key, int):
        if 0 <= key < len(devs):
            return devs[key]
        raise NotFound(f"no device {key}: the devices are {', '.join(d.name for d in devs)} "
                       f"(indices 0..{len(devs) - 1})")
    for d in devs:
        if d.name == key:
            return d
    lowered = [d for d in devs if d.name.lower() == key.lower()]
    if lowered:
        return lowered[0]
    raise NotFound(f"no device named {key!r}; devices: {[d.name for d in devs]}")
