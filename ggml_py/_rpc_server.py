"""``python -m ggml_py rpc-server``: the process that serves local devices over ggml's RPC.

``gg.rpc.serve()`` starts this in a child process; people start it from a shell. ggml's
``ggml_backend_rpc_start_server`` blocks forever in C and returns only when it cannot listen,
so it runs in a thread of its own: the main thread stays in Python, where Ctrl-C ends the
process quietly with status 130.
"""
from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

DEFAULT_PORT = 50052


def _parser(max_threads: int) -> argparse.ArgumentParser:
    from ._backend import usable_cores
    p = argparse.ArgumentParser(
        prog="python -m ggml_py rpc-server",
        description="Serve this machine's ggml devices over ggml's RPC protocol until stopped "
                    "(Ctrl-C or SIGTERM). ggml's RPC has NO authentication or encryption: "
                    "whoever reaches the port can use the devices and read their memory.",
)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1); anything but loopback needs "
                        "--allow-remote")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port, 1..65535 (default: {DEFAULT_PORT})")
    p.add_argument("--device", action="append", metavar="NAME",
                   help="device to serve, by name as `python -m ggml_py` lists it "
                        "(repeatable; default: CPU)")
    p.add_argument("--threads", type=int, default=usable_cores(),
                   help=f"CPU threads for the served CPU device, 1..{max_threads} (default: the "
                        "cores this process may use)")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="folder where the server caches tensors clients send by hash "
                        "(default: no cache)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --host (exposes the devices to the network; "
                        "default: refused)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also log each client connection accepted and closed (ggml's server "
                        "prints them; they are debug-level chatter, hidden by default)")
    p.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)
    return p


# the lines ggml's server prints (printf) for every client session: debug-level chatter
_CHATTER = ("Accepted client connection", "Client connection closed")


def _route_printf_output() -> None:
    """ggml's RPC server writes with printf on the C library's stdout: a banner when it
    starts, then a line per client connection accepted and one per connection closed (five
    pairs for one client session). Point fd 1 at a pipe (line-buffered, so each line comes when
    printed) and read it in a thread: the banner goes to the real stdout, the connection lines
    to the logger ``ggml.rpc`` at DEBUG level (shown with ``--verbose``). Python's own
    ``print`` keeps the real stdout. Where the C library's stdout cannot be found, nothing is
    changed."""
    import ctypes
    import logging
    libc = ctypes.CDLL(None)
    stream = None
    for symbol in ("stdout", "__stdoutp"):        # glibc, macOS
        try:
            stream = ctypes.c_void_p.in_dll(libc, symbol)
            break
        except ValueError:
            continue
    if stream is None or not hasattr(libc, "setvbuf"):
        return
    sys.stdout.flush()
    real = os.dup(1)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.close(write_end)
    libc.setvbuf.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t]
    libc.setvbuf(stream, None, 1, 0)            # _IOLBF (1 in glibc and macOS)
    sys.stdout = os.fdopen(real, "w", buffering=1)
    log = logging.getLogger("ggml.rpc")

    def pump() -> None:
        with os.fdopen(read_end, "r", errors="replace") as lines:
            for line in lines:            # drained to the end: a full pipe would stall ggml
                text = line.rstrip("\n")
                try:
                    if text.startswith(_CHATTER):
                        log.debug(text)
                    else:
                        print(text, file=sys.stdout, flush=True)
                except Exception:         # (stdout closed: keep draining)
                    pass
    threading.Thread(target=pump, daemon=True, name="ggml-rpc-stdout").start()


def _watch_parent(parent: int) -> None:
    """Exit when the parent dies (a server started by serve() never outlives its Python)."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    def loop() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(0.5)
    threading.Thread(target=loop, daemon=True).start()


def _can_listen(host: str, port: int) -> str | None:
    """None when (host, port) is free to listen on, else the reason it is not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml's server does
            s.bind((host, port))
            s.listen(1)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return f"port {port} is already in use on {host}"
        return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None


def _parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, checked (argparse's exit 2 on a bad value); warns of a remote host."""
    from . import _backend
    from .errors import InvalidArgument
    from .rpc import WARNING, _is_loopback

    p = _parser(_backend.MAX_THREADS)
    args = p.parse_args(argv)
    if not 0 < args.port < 65536:
        p.error(f"--port must be 1..65535, got {args.port}")
    try:
        _backend.check_n_threads(args.threads, "--threads")
    except InvalidArgument as e:
        p.error(str(e))
    if not _is_loopback(args.host):
        if not args.allow_remote and args.parent is None:
            p.error(f"--host {args.host} is not loopback; add --allow-remote to expose the server")
        print("WARNING: " + WARNING.format(endpoint=f"{args.host}:{args.port}"), file=sys.stderr)
    return args


def _serve(start: Any, call_args: tuple[Any, ...], args: argparse.Namespace) -> int:
    """Run ggml's server in a thread until it stops (status 1) or Ctrl-C ends the process."""
    if args.parent is None:       # (serve()'s children print to nowhere: nothing to route)
        import logging
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                            format="%(name)s: %(message)s")
        _route_printf_output()
    sys.stdout.flush()
    # the C call releases the GIL and never returns while it serves
    server = threading.Thread(target=start, daemon=True, args=call_args)
    server.start()
    try:
        while server.is_alive():
            server.join(0.5)
    except KeyboardInterrupt:
        sys.stderr.flush()
        os._exit(130)          # quietly; ggml's server thread cannot be stopped otherwise
    print(f"rpc-server: ggml's server stopped: it could not listen on {args.host}:{args.port}",
          file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    from ._features import old_rpc_api
    from ._loader import backend_fn, ffi, lib
    from . import device
    from .rpc import OLD_RPC_ONE_DEVICE

    args = _parse_args(argv)
    if args.parent:
        _watch_parent(args.parent)
    try:
        devs = [device(n) for n in (args.device or ["CPU"])]
    except LookupError as e:
        print(f"rpc-server: {e}", file=sys.stderr)
        return 2
    busy = _can_listen(args.host, args.port)
    if busy:
        print(f"rpc-server: {busy}; choose another --port", file=sys.stderr)
        return 1
    endpoint = f"{args.host}:{args.port}".encode()
    cache = ffi.new("char[]", args.cache_dir.encode()) if args.cache_dir else ffi.NULL
    if old_rpc_api():            # the first RPC API: one backend per server, memory told by the caller
        if len(devs) != 1:
            print(f"rpc-server: {OLD_RPC_ONE_DEVICE}", file=sys.stderr)
            return 2
        start = backend_fn("ggml_backend_rpc_start_server",
                           "void (*)(ggml_backend_t, const char *, const char *, size_t, size_t)")
        backend = lib.ggml_backend_dev_init(devs[0].ptr, ffi.NULL)
        if backend == ffi.NULL:
            print(f"rpc-server: {devs[0].name} could not start a backend", file=sys.stderr)
            return 1
        if devs[0].type == "cpu":
            lib.ggml_backend_cpu_set_n_threads(backend, args.threads)
        free, total = devs[0].memory
        call_args: tuple[Any, ...] = (backend, endpoint, cache, free, total)
    else:
        start = backend_fn("ggml_backend_rpc_start_server",
                           "void (*)(const char *, const char *, size_t, size_t, ggml_backend_dev_t *)")
        arr = ffi.new("ggml_backend_dev_t[]", [d.ptr for d in devs])
        call_args = (endpoint, cache, args.threads, len(devs), arr)
    if start is None:
        print("rpc-server: this build has no RPC server", file=sys.stderr)
        return 1
    return _serve(start, call_args, args)
