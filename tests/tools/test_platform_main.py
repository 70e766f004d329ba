"""`python -m ggml_py` on another platform's facts (issue 33): a device that cannot run the
matmul check reports "unsupported" and does not fail the command (hosted macOS runners'
paravirtual GPU lacks simdgroup reduction, so Metal refuses mul_mat there); the CPU module is
found through the dynamic loader (dladdr), not /proc, which macOS does not have."""
import io
import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

import ggml_py as gg
import ggml_py.__main__ as main
from ggml_build.flags import Platform, library_suffix

HOST = Platform(platform.system(), nvcc=False, nvidia_gpu=False)


def _refuse_on(name, error):
    """matmul_check as it goes on a device named `name` that raises `error` (what
    Graph.compute raises on Metal without simdgroup reduction: UnsupportedError)."""
    real = main.matmul_check

    def check(dev, *a, **k):
        if dev.name == name:
            raise error
        return real(dev, *a, **k)
    return check


def test_unsupported_is_not_a_failure(monkeypatch):
    msg = "compute: backend MTL0 does not support MUL_MAT (f32)"
    monkeypatch.setattr(main, "matmul_check", _refuse_on("CPU", gg.UnsupportedError(msg)))
    out = io.StringIO()
    assert main.show(out) == 0
    assert "unsupported" in out.getvalue() and "FAIL" not in out.getvalue()
    out = io.StringIO()
    assert main.show(out, as_json=True) == 0
    cpu = next(d for d in json.loads(out.getvalue())["devices"] if d["name"] == "CPU")
    assert cpu["matmul_check"]["result"] == "unsupported" and cpu["matmul_check"]["ok"] is False


def test_an_error_is_still_a_failure(monkeypatch):
    monkeypatch.setattr(main, "matmul_check", _refuse_on("CPU", gg.GGMLError("ggml failed")))
    out = io.StringIO()
    assert main.show(out) == 1
    assert "FAIL" in out.getvalue()


def test_a_wrong_result_is_still_a_failure(monkeypatch):
    monkeypatch.setattr(main, "matmul_check", lambda dev, *a, **k: 1.0)
    out = io.StringIO()
    assert main.show(out, as_json=True) == 1
    cpu = next(d for d in json.loads(out.getvalue())["devices"] if d["name"] == "CPU")
    assert cpu["matmul_check"]["result"] == "fail"


def test_a_device_whose_server_is_gone_is_unreachable_not_a_crash():
    """An RPC device added earlier in the process stays registered after its server dies (a
    shuffled suite ran the checks after an RPC test): the report lists it as unreachable and
    checks the other devices, in a fresh process so the dead device stays out of this one."""
    code = textwrap.dedent("""
        import io, json, ggml_py as gg, ggml_py.__main__ as main
        srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
        srv.kill()
        out = io.StringIO(); rc = main.show(out)
        assert rc == 0, out.getvalue()
        assert "unreachable" in out.getvalue() and "ok" in out.getvalue(), out.getvalue()
        out = io.StringIO(); assert main.show(out, as_json=True) == 0
        devs = {d["name"]: d for d in json.loads(out.getvalue())["devices"]}
        gone = devs[dev.name]
        assert gone["memory"] is None and "gone" in gone["unreachable"], gone
        assert gone["matmul_check"]["result"] == "unreachable"
        assert devs["CPU"]["matmul_check"]["result"] == "ok"
        print("checked")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "checked" in r.stdout, r.stdout + r.stderr


def test_cpu_module_found_by_the_loader_not_proc():
    """The CPU registry's code lies in this build's CPU library, named with the platform's
    suffix: found by dladdr (macOS has no /proc/self/maps)."""
    path = main._module_file_of_cpu()
    if path is None:
        pytest.skip("this platform's C library offers no dladdr")
    assert os.path.dirname(os.path.realpath(path)) == os.path.realpath(gg.BUILD_DIR)
    name = os.path.basename(path)
    assert name.startswith("libggml-cpu")
    # linked in: a shared library (.so / .dylib); a GGML_BACKEND_DL module always ends in .so
    assert name.endswith(".so" if gg.BUILD.get("backend_dl") else library_suffix(HOST))
    assert main.cpu_variant() == main._variant_of(path)


@pytest.mark.parametrize("path,variant", [
    ("/w/ggml_py/lib/ggml-0.26.0-cpu-rpc-portable/libggml-cpu-haswell.so", "haswell"),
    ("/Users/ci/ggml_py/lib/x/libggml-cpu-apple_m1.so", "apple_m1"),     # macOS module: .so too
    ("/Users/ci/ggml_py/lib/x/libggml-cpu.dylib", None),                  # linked, not a variant
    ("/w/lib/libggml-cpu.so", None),
    (None, None),
])
def test_variant_names(path, variant):
    assert main._variant_of(path) == variant
