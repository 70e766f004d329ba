"""Is an RPC server still there? Asked before every ggml call that would reach it.

ggml's RPC client aborts the process when a call reaches a server that has died, so objects
on RPC devices ask here first. The state is kept per **endpoint** ("host:port"): ``rpc.connect``
records the endpoint of each device it registers (:func:`remember`); devices registered some
other way are mapped once from their description. Nothing here knows about devices as
objects: it works on raw device handles and endpoints.
"""
from __future__ import annotations

import functools
import os
import stat
import sys
from typing import Any, Callable

from ._loader import cstr, ffi, lib
from .errors import RPCError

_ENDPOINT: dict[int, str | None] = {}   # device handle -> endpoint (None: not an RPC device)
_SOCKETS: dict[tuple[str, int], tuple[str, Any]] = {}   # (host, port) -> (fd, its two addresses)
_PROCESSES: dict[str, Any] = {}   # endpoint -> the server process rpc.serve() started there
# meta devices (ggml 0.26+, gg.meta_device): device handle -> its guard, an object with
# ``part_ptrs`` (raw handles of the devices it spans) and ``check_access(raw_tensor, what)``
_COMPOSED: dict[int, Any] = {}


def compose(dev_ptr: Any, guard: Any) -> None:
    """Record that the device `dev_ptr` spans other devices (a meta device): it is alive while
    they all are, and reads and writes of its tensors ask `guard.check_access` first."""
    _COMPOSED[_key(dev_ptr)] = guard


def served_by(endpoint: str, proc: Any) -> None:
    """Record that `endpoint` is served by the child process `proc` (``rpc.serve``): its
    liveness is then the process's, asked without touching the server's port."""
    _PROCESSES[endpoint] = proc


def _key(dev_ptr: Any) -> int:
    return int(ffi.cast("uintptr_t", dev_ptr))


def remember(dev_ptrs: list[Any], endpoint: str) -> None:
    """Record that the devices `dev_ptrs` (raw handles) are served from `endpoint`."""
    for d in dev_ptrs:
        _ENDPOINT[_key(d)] = endpoint


def endpoint_of(dev_ptr: Any) -> str | None:
    """The server endpoint ('host:port') of an RPC device, None for other devices (or None)."""
    if dev_ptr is None or dev_ptr == ffi.NULL:
        return None
    k = _key(dev_ptr)
    try:
        return _ENDPOINT[k]
    except KeyError:
        pass
    reg_ptr = lib.ggml_backend_dev_backend_reg(dev_ptr)
    if reg_ptr == ffi.NULL:          # a meta device belongs to no registry (its parts do)
        _ENDPOINT[k] = None
        return None
    reg = cstr(lib.ggml_backend_reg_name(reg_ptr)) or ""
    found = None
    if reg.startswith("RPC"):
        desc = cstr(lib.ggml_backend_dev_description(dev_ptr)) or ""
        if desc.startswith("RPC[") and desc.endswith("]"):    # ggml 0.9.x: "RPC[host:port]"
            desc = desc[4:-1]
        host, _, port = desc.rpartition(":")
        found = desc if host and port.isdigit() else None
    _ENDPOINT[k] = found
    return found


def _tcp_state(fd: str, addrs: frozenset[str], port: int) -> tuple[int, Any] | None:
    """TCP state of descriptor `fd` (in Linux's numbering) if it is a TCP connection to one of
    `addrs`:`port`, with the connection's identity (its two addresses)."""
    import socket   # (here: most imports of ggml_py never talk to a server)
    if not stat.S_ISSOCK(os.fstat(int(fd)).st_mode):
        return None
    with socket.socket(fileno=os.dup(int(fd))) as s:       # a duplicate: ggml's stays open
        if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        peer = s.getpeername()
        if peer[1] != port or (peer[0] not in addrs and peer[0].removeprefix("::ffff:") not in addrs):
            return None
        query = tcp_state_query(sys.platform)
        if query is None:
            return None
        option, to_linux = query
        state = int(s.getsockopt(socket.IPPROTO_TCP, option, 1)[0])
        return to_linux.get(state, -1) if to_linux else state, (s.getsockname(), peer)


#: macOS' TCP states (netinet/tcp_fsm.h) in Linux's numbering (1 ESTABLISHED, 8 CLOSE_WAIT)
_DARWIN_TO_LINUX = {0: 7, 1: 10, 2: 2, 3: 3, 4: 1, 5: 8, 6: 4, 7: 11, 8: 9, 9: 5, 10: 6}


def tcp_state_query(platform: str) -> tuple[int, dict[int, int] | None] | None:
    """How `platform` (a ``sys.platform`` value) reports a TCP connection's state: the
    IPPROTO_TCP option whose first byte is the state, and the map of its states to Linux's
    numbering (None: already Linux's). Linux: TCP_INFO (11); macOS: TCP_CONNECTION_INFO
    (0x106); None where unknown (the port is probed instead)."""
    if platform.startswith("linux"):
        return 11, None
    if platform == "darwin":
        return 0x106, _DARWIN_TO_LINUX
    return None


def _descriptors() -> list[str] | None:
    """This process's open descriptors: /proc/self/fd (Linux), /dev/fd (macOS)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return os.listdir(folder)
        except OSError:
            continue
    return None


@functools.lru_cache(maxsize=64)
def _addresses(host: str, port: int) -> frozenset[str] | None:
    """The addresses `host` resolves to (resolved once: this runs before every RPC call)."""
    import socket
    try:
        return frozenset(str(ai[4][0]) for ai in
                         socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP))
    except OSError:
        return None


def _connection_states(host: str, port: int) -> set[int] | None:
    """TCP states of this process's connections to host:port (each socket descriptor's peer
    and state: TCP_INFO on Linux, TCP_CONNECTION_INFO on macOS, in Linux's numbering); None
    where that cannot be read. 1 is ESTABLISHED; a server that died leaves 8 (CLOSE_WAIT) or no
    connection at all (as does a client that connects per call, as ggml's did before 0.15:
    then the port is probed). The descriptor found last time is tried first (a few
    microseconds instead of a scan of every descriptor)."""
    if tcp_state_query(sys.platform) is None:
        return None
    addrs = _addresses(host, port)
    if addrs is None:
        return None
    known = _SOCKETS.get((host, port))
    if known is not None:
        fd, ident = known
        try:
            found = _tcp_state(fd, addrs, port)
            if found is not None and found[1] == ident:
                return {found[0]}
        except OSError:
            pass
        _SOCKETS.pop((host, port), None)
    fds = _descriptors()
    if fds is None:
        return None
    states = set()
    for fd in fds:
        try:
            found = _tcp_state(fd, addrs, port)
        except OSError:
            continue
        if found is not None:
            states.add(found[0])
            if found[0] == 1:
                _SOCKETS[(host, port)] = (fd, found[1])
    return states


def reachable(endpoint: str) -> bool:
    """False only when the server at `endpoint` is known to be gone.

    A server this process started (``rpc.serve``) is alive while its process is. For other
    servers, on Linux this reads the state of ggml's own connection to it: ESTABLISHED means alive,
    a connection the server closed (CLOSE_WAIT) means dead. Without such a connection it
    probes the port: refused means dead; a timeout counts as alive, since a busy server
    (one client at a time, listen backlog of one) may leave a connection attempt waiting."""
    import socket
    proc = _PROCESSES.get(endpoint)
    if proc is not None:
        # a server of ours: probing its port would compete with ggml's own connection (a
        # server serves one client at a time, and ggml's client before 0.15 reconnects for
        # every call)
        return bool(proc.poll() is None)
    host, _, port_s = endpoint.rpartition(":")
    host = host.strip("[]")
    port = int(port_s)
    states = _connection_states(host, port)
    if states:
        return 1 in states
    # a server busy with one client (backlog of one) can refuse a connection now and then:
    # only a refusal that lasts means it is gone
    import time
    for attempt in range(8):
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except socket.gaierror:
            return False
        except ConnectionRefusedError:
            time.sleep(0.005 * (attempt + 1))
        except OSError:
            return True
    return False


def ensure_alive(dev_ptr: Any) -> None:
    """Raise RPCError when `dev_ptr` is an RPC device whose server is gone: any ggml call
    that reaches a dead server aborts the process."""
    if _COMPOSED and dev_ptr is not None and _key(dev_ptr) in _COMPOSED:
        for part in _COMPOSED[_key(dev_ptr)].part_ptrs:
            ensure_alive(part)
        return
    endpoint = endpoint_of(dev_ptr)
    if endpoint is not None and not reachable(endpoint):
        raise RPCError(f"the RPC server at {endpoint} is gone: objects on its devices can no "
                       "longer be used (close them; they are dropped without freeing)")


def check_access(dev_ptr: Any, raw_tensor: Any, what: str) -> None:
    """Before ggml reads or writes `raw_tensor` on device `dev_ptr`: its servers must be alive,
    and a meta device's guard must accept the access (ggml aborts on some, such as reading a
    tensor that holds partial sums)."""
    ensure_alive(dev_ptr)
    if _COMPOSED and dev_ptr is not None and _key(dev_ptr) in _COMPOSED:
        _COMPOSED[_key(dev_ptr)].check_access(raw_tensor, what)


def free_guard(dev_ptr: Any) -> Callable[[], bool] | None:
    """For RPC devices: a check that the server still answers (freeing remote memory of a
    dead server aborts the process); None for other devices."""
    if _COMPOSED and dev_ptr is not None and _key(dev_ptr) in _COMPOSED:
        guards = [g for g in (free_guard(p) for p in _COMPOSED[_key(dev_ptr)].part_ptrs) if g]
        return None if not guards else (lambda: all(g() for g in guards))
    endpoint = endpoint_of(dev_ptr)
    return None if endpoint is None else functools.partial(reachable, endpoint)


def buffer_device(buffer_ptr: Any) -> Any:
    """The device of a raw buffer (None for the CPU's and other device-less buffers)."""
    dev = lib.ggml_backend_buft_get_device(lib.ggml_backend_buffer_get_type(buffer_ptr))
    return None if dev == ffi.NULL else dev


def supports_op(dev_ptr: Any, t: Any) -> bool:
    """Whether the device can compute the raw node `t`: ggml's answer, and for an RPC device
    the local CPU's as well. ggml's RPC client answers yes to every op (a TODO in
    ggml-rpc.cpp's ``supports_op``, in every pinned release) and the server's backend then
    aborts on what it cannot run, so an RPC server dies of, say, a type the CPU kernel lacks.
    The servers ggml_py starts run this build's CPU backend; for a server on a GPU this may
    refuse an op the GPU could run (the CPU is every scheduler's fallback anyway)."""
    if not lib.ggml_backend_dev_supports_op(dev_ptr, t):
        return False
    cpu = second_opinion(dev_ptr)
    return cpu is None or bool(lib.ggml_backend_dev_supports_op(cpu, t))


def second_opinion(dev_ptr: Any) -> Any:
    """The device that must support an op as well for `dev_ptr` to run it (see
    :func:`supports_op`): the local CPU for an RPC device (or a meta device over one), else
    None."""
    if _COMPOSED and _key(dev_ptr) in _COMPOSED:
        if not any(endpoint_of(p) for p in _COMPOSED[_key(dev_ptr)].part_ptrs):
            return None
    elif endpoint_of(dev_ptr) is None:
        return None
    cpu = lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU)
    return None if cpu == ffi.NULL else cpu
