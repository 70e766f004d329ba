"""Registries and devices: ``ggml_backend_reg_*`` and ``ggml_backend_dev_*``.

Both belong to ggml and live as long as the process; these objects only borrow them.

    >>> import ggml_py as gg
    >>> [d.name for d in gg.devices()]            # doctest: +SKIP
    ['CPU']
    >>> cpu = gg.device("CPU"); cpu.caps.events
    False
"""
from __future__ import annotations

import functools
import os
import sys
from typing import NamedTuple

from ._loader import BUILD, BUILD_DIR, cstr, ffi, lib
from ._handle import Borrowed
from .errors import InvalidArgument, NotFound, UnsupportedError, require

_TYPES = {}
for _name in ("CPU", "GPU", "IGPU", "ACCEL", "META"):
    _v = getattr(lib, f"GGML_BACKEND_DEVICE_TYPE_{_name}", None)
    if _v is not None:
        _TYPES[int(_v)] = _name.lower()

_loaded_dl = False


def _ensure_loaded() -> None:
    """Builds with GGML_BACKEND_DL keep backends in separate modules: load them from the build."""
    global _loaded_dl
    if not _loaded_dl:
        _loaded_dl = True
        if BUILD.get("inputs", {}).get("cmake", {}).get("GGML_BACKEND_DL") == "ON":
            lib.ggml_backend_load_all_from_path(str(BUILD_DIR).encode())


class Caps(NamedTuple):
    """What a device can do (``struct ggml_backend_dev_caps``)."""
    async_: bool
    host_buffer: bool
    buffer_from_host_ptr: bool
    events: bool


_CAPS: dict[int, Caps] = {}    # device handle -> caps (devices live as long as the process)


class Registry(Borrowed):
    """A backend registry (CPU, RPC, CUDA, Metal, Vulkan...). Borrowed from ggml."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return cstr(lib.ggml_backend_reg_name(self.ptr))

    @property
    def devices(self) -> list["Device"]:
        n = lib.ggml_backend_reg_dev_count(self.ptr)
        return [Device._of(lib.ggml_backend_reg_dev_get(self.ptr, i)) for i in range(n)]

    def proc_address(self, name: str, ctype: str | None = None):
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
        out, feats = {}, fn(self.ptr)
        i = 0
        while feats[i].name != ffi.NULL:
            out[cstr(feats[i].name)] = cstr(feats[i].value)
            i += 1
        return out

    def __repr__(self):
        return f"<Registry {self.name} devices={len(self.devices)}>"


class Device(Borrowed):
    """A device (``ggml_backend_dev_t``). Borrowed from ggml; one object per device."""

    _cache: dict[int, "Device"] = {}
    __slots__ = ("__weakref__",)

    @classmethod
    def _of(cls, ptr) -> "Device":
        key = int(ffi.cast("uintptr_t", ptr))
        dev = cls._cache.get(key)
        if dev is None:
            dev = cls._cache[key] = cls(ptr)
        return dev

    # -- properties -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return cstr(lib.ggml_backend_dev_name(self.ptr))

    @property
    def description(self) -> str:
        return cstr(lib.ggml_backend_dev_description(self.ptr))

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
            _CAPS[key] = Caps(bool(getattr(c, "async")), bool(c.host_buffer),
                              bool(c.buffer_from_host_ptr), bool(c.events))
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
        return Registry(lib.ggml_backend_dev_backend_reg(self.ptr))

    @property
    def buffer_type(self):
        """The device's default buffer type."""
        from .buffer import BufferType
        return BufferType(lib.ggml_backend_dev_buffer_type(self.ptr))

    @property
    def host_buffer_type(self):
        """The pinned host buffer type of the device, or None when it has none."""
        from .buffer import BufferType
        p = lib.ggml_backend_dev_host_buffer_type(self.ptr)
        return None if p == ffi.NULL else BufferType(p)

    @property
    def buffer_types(self) -> list:
        """Default, host and extra buffer types (e.g. the CPU's repack types), without repeats."""
        from .buffer import BufferType
        found = [self.buffer_type]
        if self.host_buffer_type is not None:
            found.append(self.host_buffer_type)
        fn = self.registry.proc_address("ggml_backend_dev_get_extra_bufts",
                                        "ggml_backend_dev_get_extra_bufts_t")
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
    def supports_op(self, tensor) -> bool:
        """Whether the device can compute `tensor`'s op (a node of a graph)."""
        return bool(lib.ggml_backend_dev_supports_op(self.ptr, tensor.ptr))

    def supports_buffer_type(self, buft) -> bool:
        return bool(lib.ggml_backend_dev_supports_buft(self.ptr, buft.ptr))

    def offload_op(self, tensor) -> bool:
        return bool(lib.ggml_backend_dev_offload_op(self.ptr, tensor.ptr))

    # -- owned things made from it ----------------------------------------------------------
    def backend(self, n_threads: int | None = None, params: str | None = None):
        """A new :class:`Backend` (stream/queue) on this device.

        CPU-type backends use the cores this process may use unless `n_threads` says otherwise.
        """
        from .backend import Backend
        ensure_alive(self.ptr)
        return Backend._create(self, n_threads=n_threads, params=params)

    def event(self):
        """A new :class:`Event` on this device; :class:`UnsupportedError` when it has none."""
        from .event import Event
        ensure_alive(self.ptr)
        return Event._create(self)

    def buffer_from_host(self, array):
        """A buffer over `array`'s own memory (zero copy); keeps `array` alive."""
        from .buffer import Buffer
        return Buffer._from_host(self, array)

    def __repr__(self):
        return f"<Device {self.name} ({self.type}) {self.description!r}>"


def registries() -> list[Registry]:
    """Every backend registry, in ggml's order."""
    _ensure_loaded()
    return [Registry(lib.ggml_backend_reg_get(i)) for i in range(lib.ggml_backend_reg_count())]


def devices() -> list[Device]:
    """Every device of every registry, in ggml's order (RPC devices once connected)."""
    _ensure_loaded()
    return [Device._of(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


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
        raise NotFound(f"no device {key}: there are {len(devs)} ({[d.name for d in devs]})")
    for d in devs:
        if d.name == key:
            return d
    lowered = [d for d in devs if d.name.lower() == key.lower()]
    if lowered:
        return lowered[0]
    raise NotFound(f"no device named {key!r}; devices: {[d.name for d in devs]}")


def require_events(dev: Device) -> None:
    if not dev.caps.events:
        raise UnsupportedError(f"device {dev.name} has no events (its caps: {dev.caps})")


def rpc_endpoint(dev_ptr) -> str | None:
    """The server endpoint of an RPC device ('host:port'), None for other devices."""
    reg = cstr(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev_ptr))) or ""
    if not reg.startswith("RPC"):
        return None
    desc = cstr(lib.ggml_backend_dev_description(dev_ptr)) or ""
    host, _, port = desc.rpartition(":")
    return desc if host and port.isdigit() else None


_SOCKETS: dict[tuple[str, int], tuple[str, str]] = {}   # (host, port) -> (fd, "socket:[inode]")


def _tcp_state(fd: str, addrs: set, port: int) -> int | None:
    """TCP state of descriptor `fd` if it is a TCP connection to one of `addrs`:`port`."""
    import socket
    with socket.socket(fileno=os.dup(int(fd))) as s:       # a duplicate: ggml's stays open
        if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        peer = s.getpeername()
        if peer[1] != port or (peer[0] not in addrs and peer[0].removeprefix("::ffff:") not in addrs):
            return None
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


@functools.lru_cache(maxsize=64)
def _addresses(host: str, port: int) -> frozenset | None:
    """The addresses `host` resolves to (resolved once: this runs before every RPC call)."""
    import socket
    try:
        return frozenset(ai[4][0] for ai in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP))
    except OSError:
        return None


def _connection_states(host: str, port: int) -> set[int] | None:
    """TCP states of this process's connections to host:port (Linux: each socket descriptor's
    peer and ``TCP_INFO``); None where that cannot be read. 1 is ESTABLISHED; a server that
    died leaves 8 (CLOSE_WAIT) or no connection at all. The descriptor found last time is
    tried first (a few microseconds instead of a scan of every descriptor)."""
    if not sys.platform.startswith("linux"):
        return None
    addrs = _addresses(host, port)
    if addrs is None:
        return None
    known = _SOCKETS.get((host, port))
    if known is not None:
        fd, link = known
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == link:
                state = _tcp_state(fd, addrs, port)
                if state is not None:
                    return {state}
        except OSError:
            pass
        del _SOCKETS[(host, port)]
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    states = set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            if not link.startswith("socket:"):
                continue
            state = _tcp_state(fd, addrs, port)
        except OSError:
            continue
        if state is not None:
            states.add(state)
            if state == 1:
                _SOCKETS[(host, port)] = (fd, link)
    return states


def _reachable(endpoint: str) -> bool:
    """False only when the server at `endpoint` is known to be gone.

    On Linux this reads the state of ggml's own connection to it: ESTABLISHED means alive,
    a connection the server closed (CLOSE_WAIT) means dead. Without such a connection it
    probes the port: refused means dead; a timeout counts as alive, since a busy server
    (one client at a time, listen backlog of one) may leave a connection attempt waiting."""
    import socket
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    states = _connection_states(host, int(port))
    if states:
        return 1 in states
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except (ConnectionRefusedError, socket.gaierror):
        return False
    except OSError:
        return True


def ensure_alive(dev_ptr) -> None:
    """Raise RPCError when `dev_ptr` is an RPC device whose server is gone: any ggml call
    that reaches a dead server aborts the process."""
    if dev_ptr is None or dev_ptr == ffi.NULL:
        return
    endpoint = rpc_endpoint(dev_ptr)
    if endpoint is not None and not _reachable(endpoint):
        from .errors import RPCError
        raise RPCError(f"the RPC server at {endpoint} is gone: objects on its devices can no "
                       "longer be used (close them; they are dropped without freeing)")


def buffer_device(buffer_ptr):
    """The device of a raw buffer (None for the CPU's and other device-less buffers)."""
    dev = lib.ggml_backend_buft_get_device(lib.ggml_backend_buffer_get_type(buffer_ptr))
    return None if dev == ffi.NULL else dev


def free_guard(dev_ptr):
    """For RPC devices: a check that the server still answers (freeing remote memory of a
    dead server aborts the process); None for other devices."""
    endpoint = rpc_endpoint(dev_ptr) if dev_ptr is not None and dev_ptr != ffi.NULL else None
    return None if endpoint is None else (lambda: _reachable(endpoint))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1
