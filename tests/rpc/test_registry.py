"""Registries and devices."""
import pytest

import ggml_py as gg
from support import needs_release


def test_registries_and_devices_enumerate():
    regs = gg.registries()
    assert {"CPU", "RPC"} <= {r.name for r in regs}
    devs = gg.devices()
    assert "CPU" in [d.name for d in devs]          # ggml lists accelerators first (CUDA0...)
    assert sum(len(r.devices) for r in regs) == len(devs)


def test_device_properties(dev):
    free, total = dev.memory
    assert 0 <= free <= total and total > 0
    assert dev.type in ("cpu", "gpu", "igpu", "accel")
    assert isinstance(dev.caps, gg.Caps) and dev.description
    assert any(dev in r.devices for r in gg.registries())
    # RPC devices report the shared RPC registry, not the per-server one that lists them
    assert dev.registry.name in {r.name for r in gg.registries()}
    # ggml leaves the CPU buffer type without a device
    assert dev.buffer_type.device == (None if dev.type == "cpu" else dev)
    assert dev.buffer_types[0] == dev.buffer_type
    h = dev.host_buffer_type
    assert h is None or h.is_host


def test_cpu_caps(cpu):
    c = cpu.caps
    assert c.events is False and c.async_ is False and c.buffer_from_host_ptr is True
    assert cpu.type == "cpu" and cpu.host_buffer_type is None
    assert cpu.registry.features  # the CPU backend reports its build features


@needs_release("0.23.0", "events on RPC devices")
def test_rpc_devices_have_events_and_async(rpc_devs):
    for d in rpc_devs:
        assert d.caps.events and d.caps.async_
        assert d.registry.name.startswith("RPC")


def test_lookup_by_name_index_and_type(rpc_devs):
    assert gg.device("CPU") is gg.device(type="cpu")
    assert gg.device(0) is gg.devices()[0]
    assert gg.device("cpu") is gg.device("CPU")
    assert gg.device(rpc_devs[1].name) is rpc_devs[1]


@pytest.mark.parametrize("key, kw", [("NOPE", {}), (99, {}), (-1, {}), (None, {"type": "accel"})])
def test_lookup_misses_raise_lookup_error(key, kw):
    with pytest.raises(LookupError, match="no device"):
        gg.device(key, **kw)


def test_supports_op(cpu):
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 4))
        assert cpu.supports_op(a + a)


# ggml-vulkan's reading of GGML_VK_VISIBLE_DEVICES (ggml_vk_instance_init), word for word
_VK_PARSE = r"""
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
int main(int argc, char ** argv) {
    std::string devices(argv[1]);
    std::replace(devices.begin(), devices.end(), ',', ' ');
    std::stringstream ss(devices);
    size_t tmp;
    while (ss >> tmp) { std::printf("%zu\n", tmp); }
}
"""


def test_visible_vulkan_devices_are_read_as_ggml_reads_them(tmp_path):
    """ggml_py refuses a GGML_VK_VISIBLE_DEVICES index past the loader's devices before ggml
    reads it (ggml would end the process): that check must read the value as ggml does.
    Generated values against ggml's own parsing code, compiled here."""
    import shutil
    import subprocess
    from hypothesis import given, settings, strategies as st
    from ggml_py._vulkan import visible_indices
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build ggml's parser")
    (tmp_path / "p.cpp").write_text(_VK_PARSE)
    exe = tmp_path / "p"
    subprocess.run([cxx, "-O0", "-o", str(exe), str(tmp_path / "p.cpp")], check=True)

    @settings(max_examples=150, deadline=None)
    @given(st.text(alphabet="0123456789,+- x\t", max_size=24))
    def check(spec):
        out = subprocess.run([str(exe), spec], capture_output=True, text=True, check=True).stdout
        assert visible_indices(spec) == [int(x) for x in out.split()], spec

    check()
