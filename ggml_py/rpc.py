"""ggml's RPC backend from Python: serve local devices, connect to remote ones.

    srv = gg.rpc.serve(gg.device("CPU"))        # a real ggml RPC server, in its own process
    reg = gg.rpc.connect(srv.endpoint)           # its devices now appear in gg.devices()

RPC has **no authentication and no encryption**: anyone who reaches the port can run work and
read memory on the served devices. ``serve`` binds to loopback unless ``allow_remote=True``.
A server serves one client at a time. ``ggml_backend_rpc_add_server`` aborts the process when
nothing listens, so ``connect`` probes the port first and raises ``ConnectionError``.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
import subprocess
import sys
import time
import warnings
from typing import Any
from pathlib import Path

from ._features import old_rpc_api
from ._loader import BUILD, BUILD_DIR, LIB_ROOT, backend_fn, ffi, lib
from .errors import (GGMLError, InvalidType, RPCError, RPCVersionError, UnsupportedError,
                     check_ptr, require)
from . import _backend, _finalize, _rpc_liveness
from ._context import Context
from ._device import Device, Registry, device as _lookup
from ._device_env import env_at_first_lookup

OLD_RPC_ONE_DEVICE = ("this build's RPC server (ggml 0.9.x, protocol 2.0.0) serves one device; "
                      "serving several from one server arrived in ggml 0.10")

WARNING = ("ggml's RPC server has no authentication or encryption: anyone who can reach "
           "{endpoint} can use its devices. Never expose it to an untrusted network.")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """'host:port' -> (host, port), validated."""
    require(isinstance(endpoint, str), f"endpoint must be 'host:port', not {endpoint!r}",
            InvalidType)
    require(endpoint.isascii() and endpoint.isprintable() and " " not in endpoint,
            f"endpoint {endpoint!r} must be printable ASCII without spaces (ggml's rule)")
    host, sep, port = endpoint.rpartition(":")
    require(bool(sep) and bool(host), f"endpoint {endpoint!r} is not 'host:port'")
    require(port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536,
            f"port of {endpoint!r} must be 1..65535")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def probe(endpoint: str, timeout: float = 5.0) -> None:
    """Raise RPCError (a ConnectionError) unless something accepts TCP connections at
    `endpoint`."""
    host, port = parse_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        raise RPCError(f"no RPC server reachable at {endpoint}: {e}") from None


HELLO = 14               # RPC_CMD_HELLO, fixed across protocol versions
CONN_CAPS = 24           # RPC_CONN_CAPS_SIZE: the HELLO request; the reply adds 4 version bytes


def hello_request(old: bool | None = None) -> bytes:
    """ggml's HELLO as this build's client sends it: the command, the payload size, the
    connection caps (protocol 2, ggml 0.9.x: no payload). `old` asks for the other form."""
    caps = 0 if (old_rpc_api() if old is None else old) else CONN_CAPS
    return bytes([HELLO]) + struct.pack("<Q", caps) + bytes(caps)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def hello(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """The protocol version (major, minor, patch) of the ggml RPC server at `endpoint`, asked
    with ggml's own HELLO handshake over a connection of our own.

    Raises RPCError when nothing listens, when the server does not answer within `timeout`
    (it serves one client at a time: busy), or when it hangs up without answering, and
    RPCVersionError when the versions cannot talk (ggml's client would abort the process on
    any of these). A server that hangs up on this build's HELLO is asked once more in the
    other era's form (protocol 2 sent no payload, later ones send connection caps), so that a
    server of another release is named by its version."""
    size, reply = _hello_once(endpoint, timeout, hello_request())
    if len(size) < 8:
        size, reply = _hello_once(endpoint, timeout, hello_request(old=not old_rpc_api()))
        if len(size) == 8 and len(reply) >= 3:
            _check_version(endpoint, tuple(reply[:3]), force=True)
    ours = _our_version()
    if len(size) < 8:
        raise RPCError(f"{endpoint} hung up without answering ggml's HELLO: not a ggml RPC "
                       f"server, or one of a ggml release whose protocol differs from "
                       f"{'.'.join(map(str, ours))}")
    if len(reply) < 3:
        raise RPCVersionError(f"{endpoint} answered HELLO with {len(reply)} bytes: not a "
                              "protocol this build speaks")
    theirs = (reply[0], reply[1], reply[2])
    _check_version(endpoint, theirs)
    return theirs


def _our_version() -> tuple[int, int, int]:
    return (int(lib.RPC_PROTO_MAJOR_VERSION), int(lib.RPC_PROTO_MINOR_VERSION),
            int(lib.RPC_PROTO_PATCH_VERSION))


def _check_version(endpoint: str, theirs: tuple[int, ...], force: bool = False) -> None:
    """RPCVersionError unless a client of this build can talk to a server of `theirs`
    (`force`: it cannot, whatever the numbers say: it refused this build's HELLO)."""
    ours = _our_version()
    if force or theirs[0] != ours[0] or theirs[1] > ours[1]:
        raise RPCVersionError(
            f"the RPC server at {endpoint} speaks protocol {'.'.join(map(str, theirs))}, this "
            f"build (ggml {BUILD['release']}) speaks {'.'.join(map(str, ours))}: run server and "
            "client from releases with the same major protocol version")


def _hello_once(endpoint: str, timeout: float, request: bytes) -> tuple[bytes, bytes]:
    """Send one HELLO `request` on a new connection: (the reply's size field, the reply),
    both empty when the server hung up."""
    host, port = parse_endpoint(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise RPCError(f"no RPC server reachable at {endpoint}: {e}") from None
    with sock:
        try:
            sock.sendall(request)
            size = _recv_exact(sock, 8)
            reply = _recv_exact(sock, struct.unpack("<Q", size)[0]) if len(size) == 8 else b""
        except (ConnectionResetError, BrokenPipeError):
            size = reply = b""                      # hung up on us: reported by the caller
        except socket.timeout:
            raise RPCError(f"the RPC server at {endpoint} did not answer within {timeout} s: it "
                           "is busy with another client (a ggml RPC server serves one at a "
                           "time)") from None
        except OSError as e:
            raise RPCError(f"the RPC server at {endpoint} broke the connection: {e}") from None
    return size, reply


class Server:
    """A ggml RPC server process. Owned: close() stops it (``with`` works too); it never
    outlives this process."""

    def __init__(self, proc: "subprocess.Popen[bytes]", endpoint: str) -> None:
        self.proc = proc
        self.endpoint = endpoint
        self._finalizer = _finalize.finalize(self, _stop, proc, stops_a_process=True)

    @property
    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self.proc.poll() is None

    def close(self) -> None:
        """Close this process's objects on the server's devices, then stop the server."""
        if self.alive:
            close_dependents(self.endpoint)
        _finalize.free_now(self._finalizer)

    def kill(self) -> None:
        """Stop the server abruptly (SIGKILL), as a crash would."""
        if self.alive:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<rpc.Server {self.endpoint} {'running' if self.alive else 'stopped'}>"


def close_dependents(endpoint: str) -> None:
    """Close every open context, buffer, event and backend that uses a device of `endpoint`
    (contexts first: they own their buffers)."""
    from ._handle import LIVE
    users = [o for o in list(LIVE) if not o.closed
             and any(_rpc_liveness.endpoint_of(d) == endpoint for d in o._devices())]
    for o in sorted(users, key=lambda o: not isinstance(o, Context)):
        o.close()


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(devices: Any = None, host: str = "127.0.0.1", port: int = 0, cache_dir: str | None = None,
          threads: int | None = None, *, allow_remote: bool = False, timeout: float = 30.0,
          build: "str | os.PathLike[str] | None" = None) -> Server:
    """Start ``ggml_backend_rpc_start_server`` (which blocks) in a child process serving
    `devices` (a Device, a name, or a list; default: the CPU), and wait until it accepts.

    `build` runs the server from another build folder (a path, or a folder name under
    ggml_py/lib such as "ggml-0.20.2-cpu-rpc"): a server of another release, for regression
    runs across releases. Its device names are then looked up in that build."""
    if build is not None:
        folder = Path(build) if os.sep in str(build) else LIB_ROOT / str(build)
        require((folder / "build.json").exists(), f"no finished build in {folder}")
    if devices is None:
        devices = ["CPU"]
    elif isinstance(devices, (Device, str)):
        devices = [devices]
    if build is None:             # (another build's server says so itself, from its process)
        require(not old_rpc_api() or len(devices) == 1, OLD_RPC_ONE_DEVICE, UnsupportedError)
    names = [d.name if isinstance(d, Device) else (d if build else _lookup(d).name)
             for d in devices]
    require(isinstance(port, int) and not isinstance(port, bool) and 0 <= port < 65536,
            f"serve: port must be an int in 0..65535, got {port!r}")
    if threads is not None:
        threads = _backend.check_n_threads(threads, "serve: threads")
    if port:
        _refuse_port_in_use(host, port)
    if not _is_loopback(host):
        require(allow_remote, f"binding to {host} exposes the server beyond this machine; pass "
                              "allow_remote=True to do so deliberately")
        warnings.warn(WARNING.format(endpoint=f"{host}:{port}"), stacklevel=2)
    port = port or _free_port(host)
    endpoint = f"{host}:{port}"
    cmd = [sys.executable, "-m", "ggml_py", "rpc-server", "--host", host, "--port", str(port),
           "--parent", str(os.getpid())]
    for n in names:
        cmd += ["--device", n]
    if cache_dir:
        cmd += ["--cache-dir", str(cache_dir)]
    if threads:
        cmd += ["--threads", str(threads)]
    env = server_env(names, folder if build is not None else BUILD_DIR)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    server = Server(proc, endpoint)
    _rpc_liveness.served_by(endpoint, proc)
    _wait_accepting(server, host, port, timeout)
    return server


def _refuse_port_in_use(host: str, port: int) -> None:
    """RPCError when something accepts connections at `host`:`port` already."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            in_use = True
    except OSError:
        in_use = False
    if in_use:
        raise RPCError(f"serve: port {port} of {host} is in use (something accepts "
                       "connections there): pick another port, or port=0 for a free one")


def _wait_accepting(server: Server, host: str, port: int, timeout: float) -> None:
    """Until the server's child accepts connections: GGMLError with its last words when it
    exits first, TimeoutError (the child stopped) after `timeout` seconds."""
    proc = server.proc
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise GGMLError(f"the RPC server exited (code {proc.returncode}) before accepting "
                            f"connections:\n{err}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                server.close()
                raise TimeoutError(f"the RPC server did not accept connections at "
                                   f"{server.endpoint} within {timeout} s") from None
            time.sleep(0.05)


def server_env(names: list[str], folder: "str | os.PathLike[str]") -> dict[str, str]:
    """The environment of a server child serving the devices `names` from the build `folder`.
    A server that serves no Metal device gets ``GGML_METAL_DEVICES=0``: ggml then makes no
    Metal device, so the child neither opens the GPU nor compiles the Metal library for each
    virtual device before it listens (seconds each, against serve()'s timeout). One that
    serves a Metal device gets the count this process's ggml was made with, so that the
    names mean the same devices there."""
    env = dict(os.environ, GGML_PY_BUILD=str(folder))
    var = "GGML_METAL_DEVICES"
    if any(n.startswith("MTL") or n == "Metal" for n in names):
        count = env_at_first_lookup(var)
        if count is None:
            env.pop(var, None)
        else:
            env[var] = count
    else:
        env[var] = "0"
    return env


_connected: dict[str, Registry] = {}
_keepalive: dict[str, list[Any]] = {}


def connect(endpoint: str, timeout: float = 5.0) -> Registry:
    """Register the server at `endpoint`; its devices appear in ``gg.devices()``.

    The server is asked for its protocol version first (:func:`hello`): nothing listening, a
    busy server, a server of an incompatible release or something that is no ggml RPC server
    raise :class:`RPCError` (a ``ConnectionError``) within `timeout` seconds, where ggml's
    client would abort the process or wait forever."""
    parse_endpoint(endpoint)
    if endpoint in _connected:
        return _connected[endpoint]
    hello(endpoint, timeout)
    # ggml's client then opens connections of its own and aborts the process when one is
    # refused or hung up: the server must also answer on a fresh connection after ours closed
    # (a peer that answers HELLO once and then closes every connection is refused here)
    try:
        hello(endpoint, timeout)
    except RPCError as e:
        raise RPCError(f"{endpoint} answered ggml's HELLO once, then failed on a new "
                       f"connection ({e}); ggml's client would abort the process") from None
    if old_rpc_api():
        return _connect_one_device(endpoint)
    add_server = backend_fn("ggml_backend_rpc_add_server", "ggml_backend_reg_t (*)(const char *)")
    if add_server is None:
        raise RPCError("this build has no RPC backend")
    raw = check_ptr(add_server(endpoint.encode()),
                    f"the RPC server at {endpoint} offers no devices", RPCError)
    lib.ggml_backend_register(raw)
    _rpc_liveness.remember([lib.ggml_backend_reg_dev_get(raw, i)
                        for i in range(int(lib.ggml_backend_reg_dev_count(raw)))], endpoint)
    reg = _connected[endpoint] = Registry(raw)
    _keep_connected(endpoint, reg.devices)
    return reg


class EndpointRegistry(Registry):
    """The RPC registry as seen from one server of ggml 0.9.x, whose RPC backend has one
    registry for every endpoint and enumerates no devices: ``devices`` is the device
    ``ggml_backend_rpc_add_device`` made for this endpoint."""

    __slots__ = ("_devices",)

    def __init__(self, ptr: Any, devices: list[Device]) -> None:
        super().__init__(ptr)
        self._devices = devices

    @property
    def devices(self) -> list[Device]:
        """The server's devices, as this process sees them (named RPC<i> in the process' order)."""
        return list(self._devices)


def _connect_one_device(endpoint: str) -> Registry:
    """ggml 0.9.x: one device per endpoint (``ggml_backend_rpc_add_device``), registered with
    ggml's device list so that it appears in ``gg.devices()``."""
    add_device = backend_fn("ggml_backend_rpc_add_device", "ggml_backend_dev_t (*)(const char *)")
    raw = check_ptr(add_device(endpoint.encode()),
                    f"the RPC server at {endpoint} offers no devices", RPCError)
    lib.ggml_backend_device_register(raw)
    _rpc_liveness.remember([raw], endpoint)
    dev = Device._of(raw)
    reg = _connected[endpoint] = EndpointRegistry(lib.ggml_backend_dev_backend_reg(raw), [dev])
    _keep_connected(endpoint, [dev])
    return reg


def _keep_connected(endpoint: str, devices: list[Device]) -> None:
    # ggml's client holds its connection to a server only while a buffer there lives, and
    # otherwise connects again for every call; servers before 0.15 then refuse or reset some
    # of those connections and the client aborts. One small buffer per device keeps the
    # connection (closed with the server's other objects, see Server.close)
    keep = []
    for d in devices:
        try:
            keep.append(d.buffer_type.alloc(1))
        except GGMLError:           # (a full device: connect anyway, without the pin)
            pass
    _keepalive[endpoint] = keep


# The server process itself (`python -m ggml_py rpc-server`) is ggml_py/_rpc_server.py.

__all__ = ["serve", "connect", "Server", "EndpointRegistry", "probe", "hello", "parse_endpoint",
           "WARNING"]


def __dir__() -> list[str]:       # dir() and help() show the module's API only
    return sorted(__all__)
