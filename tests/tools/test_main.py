"""The main job and the README's first example."""
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from support import child_env

ROOT = Path(__file__).resolve().parents[2]


def test_python_m_ggml_py_lists_devices_and_checks_matmul():
    r = subprocess.run([sys.executable, "-m", "ggml_py"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ggml 0." in r.stdout and "CPU" in r.stdout and "buffer type CPU" in r.stdout
    assert re.search(r"CPU\s+ok", r.stdout)


def run_main(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "ggml_py", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


def test_json_has_stable_keys():
    r = run_main("--json")
    assert r.returncode == 0, r.stderr
    import json
    data = json.loads(r.stdout)
    assert set(data) == {"ggml_version", "build", "registries", "devices"}
    assert {"folder", "release", "backends", "bindings", "backend_dl", "cpu_variant"} <= set(data["build"])
    cpu = next(d for d in data["devices"] if d["name"] == "CPU")
    from ggml_py.raw import ffi          # every cap of the release's struct (issue 32)
    assert list(cpu["caps"]) == [n for n, _ in ffi.typeof("struct ggml_backend_dev_caps").fields]
    assert cpu["matmul_check"]["ok"] is True and cpu["matmul_check"]["nmse"] < 5e-4
    assert cpu["buffer_types"][0]["name"] == "CPU"


def test_help_lists_every_command():
    r = run_main("--help")
    assert r.returncode == 0
    for cmd in ("rpc-server", "compare", "--json"):
        assert cmd in r.stdout
    r = run_main("rpc-server", "--help")
    assert r.returncode == 0
    for opt in ("--host", "--port", "--device", "--threads", "--cache-dir", "--allow-remote"):
        assert opt in r.stdout
    assert "default: 127.0.0.1" in r.stdout and "default: 50052" in r.stdout


def test_missing_build_names_the_builds_there_are():
    r = run_main(env={"GGML_PY_BUILD": "no-such-build"})
    assert r.returncode != 0
    assert "GGML_PY_BUILD=no-such-build names no finished build" in r.stderr
    assert "builds here:" in r.stderr and "python build_ggml.py" in r.stderr


def test_rpc_server_port_in_use_fails_with_the_reason():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_main("rpc-server", "--port", str(port))
    assert r.returncode == 1
    assert f"port {port} is already in use" in r.stderr


def test_rpc_server_bad_options_are_refused():
    r = run_main("rpc-server", "--threads", "0")
    assert r.returncode == 2 and "--threads must be an int in 1.." in r.stderr
    r = run_main("rpc-server", "--port", "70000")
    assert r.returncode == 2 and "--port must be 1..65535" in r.stderr
    r = run_main("rpc-server", "--host", "0.0.0.0")
    assert r.returncode == 2 and "--allow-remote" in r.stderr


def _interruptible():
    """In the server child, before exec: SIGINT at its default. A shell without job control
    starts background commands with SIGINT ignored, children inherit that, and Python then
    installs no KeyboardInterrupt handler: the suite run from such a job (the mutation tool's
    map, `cmd &` in a script) saw the server ignore Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_server(*options):
    """`python -m ggml_py rpc-server` on a free port with `options`, once it accepts a
    connection: (process, port)."""
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "ggml_py", "rpc-server", "--port", str(port),
                          *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_interruptible)
    deadline = time.monotonic() + 60
    while True:     # serving once it accepts a connection
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return p, port
        except OSError:
            if p.poll() is not None or time.monotonic() >= deadline:
                p.kill()
                raise AssertionError(f"the server did not start: {p.communicate()[1]}")
            time.sleep(0.1)


def test_rpc_server_ctrl_c_exits_quietly_with_130():
    p, _ = _start_server()
    try:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def _serve_one_client(*options):
    """Start `python -m ggml_py rpc-server` with `options`, run one client session against it
    from another process, stop it with Ctrl-C: (stdout, stderr) of the server."""
    import time
    p, port = _start_server(*options)
    try:
        client = subprocess.run(
            [sys.executable, "-c", "import ggml_py as gg; (d,) = gg.rpc.connect("
             f"'127.0.0.1:{port}').devices; print(d.name, d.memory[1] > 0)"],
            capture_output=True, text=True, timeout=120)
        assert client.returncode == 0 and "True" in client.stdout, client.stderr
        time.sleep(0.5)                 # the server's last lines
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130, err
    return out, err


def test_rpc_server_connection_chatter_is_debug_level():
    """ggml's server prints a line per connection accepted and closed (printf): the CLI shows
    its banner, and the connection lines only with --verbose (logger ggml.rpc, DEBUG)."""
    out, err = _serve_one_client()
    assert "Starting RPC server" in out, out
    assert "Accepted client connection" not in out + err
    out, err = _serve_one_client("--verbose")
    assert "Starting RPC server" in out
    assert "Accepted client connection" not in out
    assert "ggml.rpc: Accepted client connection" in err, err
    assert "ggml.rpc: Client connection closed" in err


def test_ggml_commit_is_the_trees_own():
    import ggml_py as gg
    # trees from sdists have no git history: "unknown", never this project's own commit
    ours = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    commit = gg.ggml_commit()
    assert commit and (not ours or not commit.startswith(ours[:7]))
    # nor "-dirty": outside a repository `git diff-index` fails, which 0.9.4's CMake took
    # for a dirty tree
    if gg.BUILD["inputs"].get("source") is None:
        assert "dirty" not in gg.ggml_version() and "dirty" not in commit
    if gg.BUILD["inputs"].get("source") is None:
        assert commit == "unknown"
        assert gg.BUILD.get("ggml_commit", "unknown") == "unknown"


def test_a_relative_build_selection_holds_in_other_directories(tmp_path):
    """GGML_PY_BUILD relative to the current directory: ggml_py resolves it once, so child
    processes that start elsewhere (RPC servers, notebook kernels) load the same build."""
    import ggml_py as gg
    rel = os.path.relpath(gg.BUILD_DIR, ROOT)
    code = ("import os, subprocess, sys, ggml_py as gg; print(gg.BUILD_DIR);"
            "print(subprocess.run([sys.executable, '-c', 'import ggml_py as g; print(g.BUILD_DIR)'],"
            f" cwd={str(tmp_path)!r}, capture_output=True, text=True).stdout.strip())")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=child_env(GGML_PY_BUILD=rel))
    assert r.returncode == 0, r.stderr
    here, there = r.stdout.split()
    assert Path(here) == Path(there) == gg.BUILD_DIR and Path(here).is_absolute()


def test_optional_modules_load_on_first_use():
    """`import ggml_py` stays lean: gg.rpc, gg.gguf, gg.opt, gg.compare and DLPack load when
    first touched, and each is then the module itself."""
    code = ("import sys, ggml_py as gg; names = ['rpc', 'gguf', 'opt', 'compare', 'dlpack'];"
            "print([f'ggml_py.{n}' in sys.modules for n in names]);"
            "print([getattr(gg, n) is sys.modules[f'ggml_py.{n}'] for n in names])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=child_env())
    assert r.returncode == 0, r.stderr
    before, after = r.stdout.split("\n")[:2]
    assert before == str([False] * 5) and after == str([True] * 5)
