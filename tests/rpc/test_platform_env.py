"""Environment that ggml reads on a Mac, checked here with the platform's facts substituted
(issue 33): GGML_METAL_DEVICES changed after the first device lookup is refused (ggml
re-reads it with atoi on every Metal registry call and can abort), and RPC server children that
serve no Metal device get GGML_METAL_DEVICES=0 (no GPU opened, no Metal library compiled
before they listen)."""
import os
import sys

import pytest

import ggml_py as gg
from ggml_py import _device_env
from ggml_py.rpc import server_env

VAR = "GGML_METAL_DEVICES"


@pytest.fixture
def metal_built(monkeypatch):
    """This build, as if it had the Metal backend (the guard applies to built backends)."""
    gg.devices()                                     # the first lookup has happened
    monkeypatch.setitem(gg.BUILD, "backends", list(gg.BUILD["backends"]) + ["metal"])
    return _device_env.at_first_lookup[VAR]


def _changed(first):
    return "4" if first != "4" else "2"


LOOKUPS = {
    "devices": lambda: gg.devices(),
    "device": lambda: gg.device("CPU"),
    "registries": lambda: gg.registries(),
    "buffer_type": None,        # of a Device found before the change
    "backend": None,
}


@pytest.mark.parametrize("lookup", LOOKUPS, ids=str)
def test_a_changed_device_count_is_refused(metal_built, monkeypatch, lookup):
    dev = gg.device(0)                               # (before the change)
    fn = {"buffer_type": lambda: dev.buffer_type, "backend": dev.backend}.get(lookup, LOOKUPS[lookup])
    monkeypatch.setenv(VAR, _changed(metal_built))
    with pytest.raises(gg.UnsupportedError, match=f"{VAR} changed"):
        fn()
    if metal_built is None:
        monkeypatch.delenv(VAR)
    else:
        monkeypatch.setenv(VAR, metal_built)
    got = fn()                                       # restored: accepted again
    if isinstance(got, gg.Backend):
        got.close()


def test_the_guard_is_for_built_backends_only(monkeypatch):
    gg.devices()
    first = _device_env.at_first_lookup[VAR]
    assert "metal" not in gg.BUILD["backends"] or sys.platform == "darwin"
    if "metal" in gg.BUILD["backends"]:
        pytest.skip("this build has Metal: the refusal is tested above")
    monkeypatch.setenv(VAR, _changed(first))
    assert gg.devices()                              # no Metal here: nothing re-reads it


def test_cpu_only_server_children_make_no_metal_device(monkeypatch):
    monkeypatch.setitem(_device_env.at_first_lookup, VAR, "2")
    env = server_env(["CPU"], gg.BUILD_DIR)
    assert env[VAR] == "0" and env["GGML_PY_BUILD"] == str(gg.BUILD_DIR)
    assert server_env(["MTL1"], gg.BUILD_DIR)[VAR] == "2"        # the parent's count
    assert server_env(["CPU", "MTL0"], gg.BUILD_DIR)[VAR] == "2"
    monkeypatch.setitem(_device_env.at_first_lookup, VAR, None)
    monkeypatch.setenv(VAR, "2")
    monkeypatch.setitem(gg.BUILD, "backends", [b for b in gg.BUILD["backends"] if b != "metal"])
    assert VAR not in server_env(["MTL0"], gg.BUILD_DIR)         # unset at the first lookup


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/environ"),
                    reason="reads the child's environment through /proc (Linux)")
def test_a_real_server_child_gets_no_metal_device(monkeypatch):
    """The server process serve() starts (a real ggml RPC server) has GGML_METAL_DEVICES=0."""
    with gg.rpc.serve() as srv:
        raw = open(f"/proc/{srv.proc.pid}/environ", "rb").read().split(b"\0")
        env = dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)
        assert env.get(VAR) == "0"
