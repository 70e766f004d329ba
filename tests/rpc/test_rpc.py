"""ggml RPC from Python against real servers: serving, connecting, bad endpoints, busy and
dead servers, the shell command, and servers in their own network namespaces."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import ggml_py as gg
from support import LayerStack, nmse, needs_release

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_py(code: str, timeout=120) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (for what must not leave a dead server registered here)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


# -- serving --------------------------------------------------------------------------------------
def test_serve_connect_and_compute():
    with gg.rpc.serve() as srv:
        assert srv.alive and srv.endpoint.startswith("127.0.0.1:")
        assert gg.rpc.hello(srv.endpoint) == (int(gg.lib.RPC_PROTO_MAJOR_VERSION),
                                              int(gg.lib.RPC_PROTO_MINOR_VERSION),
                                              int(gg.lib.RPC_PROTO_PATCH_VERSION))
        reg = gg.rpc.connect(srv.endpoint)
        assert gg.rpc.connect(srv.endpoint) is reg               # connecting twice is harmless
        (dev,) = reg.devices
        assert dev in gg.devices()
        assert dev.description in (srv.endpoint, f"RPC[{srv.endpoint}]")     # (0.9.x: RPC[...])
        from ggml_py.__main__ import matmul_check
        assert matmul_check(dev) < 5e-4
    assert not srv.alive


def test_server_never_outlives_its_parent():
    code = """
        import time, ggml_py as gg
        s = gg.rpc.serve()
        print(s.proc.pid, flush=True)
        time.sleep(120)
    """
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    os.kill(pid, 0)                                              # the server runs
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the RPC server outlived its parent")


def test_binding_beyond_loopback_needs_opt_in_and_warns():
    with pytest.raises(gg.InvalidArgument, match="allow_remote"):
        gg.rpc.serve(host="0.0.0.0")
    with pytest.warns(UserWarning, match="no authentication"):
        srv = gg.rpc.serve(host="0.0.0.0", allow_remote=True)
    with srv:
        assert gg.rpc.hello(f"127.0.0.1:{srv.endpoint.rpartition(':')[2]}")[0] > 0


# -- bad endpoints and servers --------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["localhost", "localhost:", ":5000", "127.0.0.1:0",
                                      "127.0.0.1:70000", "127.0.0.1:http", "127.0.0.1:-1", 5000,
                                      None])
def test_malformed_endpoints_raise(endpoint):
    with pytest.raises((gg.InvalidArgument, gg.InvalidType), match="endpoint|port"):
        gg.rpc.connect(endpoint)


@pytest.mark.parametrize("endpoint", [lambda: f"127.0.0.1:{_free_port()}",
                                      lambda: "no-such-host.invalid:50052"])
def test_unreachable_endpoints_raise_connectionerror(endpoint):
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="no RPC server reachable"):
        gg.rpc.connect(endpoint(), timeout=2)
    assert time.monotonic() - t0 < 10


@pytest.fixture
def fake_server():
    """A TCP server that treats each connection with `behaviour` (close at once, or say
    nothing): what a crashed or foreign server looks like to a client."""
    made = []

    def start(behaviour):
        lsock = socket.create_server(("127.0.0.1", 0))
        stop = threading.Event()

        def loop():
            lsock.settimeout(0.1)
            held = []
            while not stop.is_set():
                try:
                    conn, _ = lsock.accept()
                except socket.timeout:
                    continue
                if behaviour == "close":
                    conn.close()
                elif behaviour == "garbage":
                    conn.recv(64)
                    conn.sendall(b"\x02\x00\x00\x00\x00\x00\x00\x00hi")
                    conn.close()
                else:
                    held.append(conn)
            for c in held:
                c.close()
        th = threading.Thread(target=loop, daemon=True)
        th.start()
        made.append((lsock, stop, th))
        return f"127.0.0.1:{lsock.getsockname()[1]}"
    yield start
    for lsock, stop, th in made:
        stop.set()
        th.join()
        lsock.close()


def test_server_that_accepts_then_closes_raises(fake_server):
    with pytest.raises(ConnectionError, match="hung up"):
        gg.rpc.connect(fake_server("close"), timeout=2)


def test_server_that_never_answers_raises_within_the_timeout(fake_server):
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="did not answer"):
        gg.rpc.connect(fake_server("silent"), timeout=1)
    assert time.monotonic() - t0 < 5


def test_server_that_answers_nonsense_raises(fake_server):
    with pytest.raises(gg.RPCVersionError, match="answered HELLO|speaks protocol"):
        gg.rpc.connect(fake_server("garbage"), timeout=2)


def test_busy_server_raises_within_the_timeout():
    """A ggml RPC server serves one client at a time: a second one gets an error, not a hang."""
    with gg.rpc.serve() as srv:
        host, port = gg.rpc.parse_endpoint(srv.endpoint)
        first = socket.create_connection((host, port))           # a client holding the server
        first.sendall(gg.rpc.hello_request())
        assert len(first.recv(64)) > 0                            # the server serves it
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="busy"):
            gg.rpc.connect(srv.endpoint, timeout=1)
        assert time.monotonic() - t0 < 5
        first.close()
        assert gg.rpc.hello(srv.endpoint, timeout=5)[0] > 0       # free again once it left


@needs_release("0.23.0", "events on RPC devices")
def test_server_killed_while_in_use_raises_and_the_process_survives():
    # in a fresh process: the dead server's devices stay registered with ggml for good
    r = _run_py("""
        import warnings, numpy as np, ggml_py as gg
        srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
        be, ctx = dev.backend(), gg.Context()
        a = ctx.from_numpy(np.ones(64, np.float32)); ctx.alloc(be); a.set(np.ones(64, np.float32))
        out = a + a; g = gg.Graph(out); be.compute(g)
        assert out.numpy()[0] == 2
        ev = dev.event()
        srv.kill()
        raised = []
        for name, call in [("compute", lambda: be.compute(g)), ("numpy", out.numpy),
                           ("set", lambda: a.set(np.zeros(64, np.float32))),
                           ("synchronize", be.synchronize), ("record", lambda: ev.record(be)),
                           ("alloc", lambda: dev.buffer_type.alloc(1024)),
                           ("backend", dev.backend), ("memory", lambda: dev.memory),
                           ("copy", lambda: gg.copy(a, a))]:
            try:
                call()
            except ConnectionError as e:
                assert "gone" in str(e), e
                raised.append(name)
        print("raised", ",".join(raised))
        with gg.device("CPU").backend() as cb, gg.Context() as c2:   # other devices still work
            x = c2.from_numpy(np.ones(4, np.float32)); c2.alloc(cb); x.set(np.ones(4, np.float32))
            y = x * 3.0; cb.compute(gg.Graph(y)); assert y.numpy()[0] == 3
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ev.close(); ctx.close(); be.close()                     # dropped, not freed
        print("warned", sum("RPC server is gone" in str(x.message) for x in w))
        print("survived")
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(l.split(" ", 1) for l in r.stdout.split("\n") if " " in l)
    assert set(lines["raised"].split(",")) == {"compute", "numpy", "set", "synchronize", "record",
                                               "alloc", "backend", "memory", "copy"}
    assert int(lines["warned"]) >= 2
    assert r.stdout.strip().endswith("survived")


# -- the shell command ----------------------------------------------------------------------------
def test_rpc_server_command():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ggml_py", "rpc-server", "--port", str(port),
                             "--device", "CPU", "--threads", "1"], cwd=ROOT,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert gg.rpc.hello(f"127.0.0.1:{port}", timeout=5)[0] > 0
                break
            except ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("args, message", [
    (["--port", "0"], "--port"),
    (["--host", "0.0.0.0"], "--allow-remote"),
    (["--device", "NoSuchDevice"], "NoSuchDevice"),
])
def test_rpc_server_command_refuses_bad_arguments(args, message):
    r = subprocess.run([sys.executable, "-m", "ggml_py", "rpc-server", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr


# -- several hosts: servers in their own network namespaces ----------------------------------------
def _sh(*cmd):
    return subprocess.run(list(cmd), capture_output=True, text=True)


@pytest.fixture(scope="module")
def namespaced_servers():
    """Two RPC servers, each in its own network namespace reached over a veth pair (root and
    iproute2 needed; skipped where namespaces cannot be made)."""
    tag = f"gp{os.getpid() % 100000}"
    import shutil
    if os.geteuid() != 0 or not shutil.which("ip") or _sh("ip", "netns", "add", f"{tag}a").returncode != 0:
        pytest.skip("network namespaces need root and iproute2")
    spaces, procs, endpoints = [f"{tag}a"], [], []
    # two 10.N.0.0/24 subnets no interface or route of this host uses (a host already on
    # 10.248.0.1/24 would route 10.248.0.2 away from the namespace)
    used = _sh("ip", "-4", "addr").stdout + _sh("ip", "-4", "route").stdout
    start = os.getpid() % 50
    free = [n for n in [200 + (start + k) % 55 for k in range(55)]
            if f" 10.{n}." not in used and f"\n10.{n}." not in "\n" + used][:2]
    try:
        if len(free) < 2:
            pytest.skip("no free 10.N.0.0/24 subnet for the namespaces")
        _sh("ip", "netns", "add", f"{tag}b")
        spaces.append(f"{tag}b")
        for i, ns in enumerate(spaces):
            host_if, ns_if = f"{ns}h", f"{ns}n"
            subnet = free[i]
            steps = [
                ("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if),
                ("ip", "link", "set", ns_if, "netns", ns),
                ("ip", "addr", "add", f"10.{subnet}.0.1/24", "dev", host_if),
                ("ip", "link", "set", host_if, "up"),
                ("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.{subnet}.0.2/24", "dev", ns_if),
                ("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"),
                ("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"),
            ]
            for step in steps:
                r = _sh(*step)
                if r.returncode != 0:
                    pytest.skip(f"cannot set up a veth pair: {' '.join(step)}: {r.stderr.strip()}")
            endpoint = f"10.{subnet}.0.2:50052"
            env = dict(os.environ, GGML_PY_BUILD=str(gg.BUILD_DIR))
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "ggml_py", "rpc-server",
                 "--host", endpoint.split(":")[0], "--port", "50052", "--allow-remote",
                 "--parent", str(os.getpid())], cwd=ROOT, env=env, stderr=subprocess.DEVNULL))
            endpoints.append(endpoint)
        for ep in endpoints:
            deadline = time.monotonic() + 30
            while True:
                try:
                    gg.rpc.hello(ep, timeout=2)
                    break
                except ConnectionError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"no server came up at {ep}")
                    time.sleep(0.1)
        yield endpoints
    finally:
        for ep in endpoints:
            gg.rpc.close_dependents(ep)
        for p in procs:
            p.kill()
            p.wait()
        for ns in spaces:
            _sh("ip", "link", "del", f"{ns}h")
            _sh("ip", "netns", "del", ns)


@needs_release("0.23.0", "an RPC server that survives this graph (0.20.2's aborts)")
def test_graph_scheduled_across_cpu_and_two_namespaced_hosts(namespaced_servers, cpu, rng):
    a_ep, b_ep = namespaced_servers
    # the servers are not on this host's loopback: only the veth addresses reach them
    with pytest.raises(ConnectionError, match="no RPC server reachable"):
        gg.rpc.hello(f"127.0.0.1:{a_ep.split(':')[1]}", timeout=1)
    devs = [gg.rpc.connect(ep).devices[0] for ep in (a_ep, b_ep)]
    bes = [devs[0].backend(), devs[1].backend(), cpu.backend()]
    stack = LayerStack(bes, bes[2], rng)          # host A, host B, then the local CPU
    with gg.Scheduler(bes) as sched:
        sched.compute(gg.Graph(stack.out))
        assert sched.n_splits >= 3
        assert nmse(stack.out.numpy(copy=True), stack.ref) < 5e-4
    stack.close()
    for b in bes:
        b.close()
