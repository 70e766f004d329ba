"""Metal virtual devices (macOS only; skipped elsewhere).

Run with GGML_METAL_DEVICES=N set before ggml_py loads (the CI workflow sets 2; set 3 to run
every case here). Not run on this project's Linux machines: there is no Metal there."""
import os
import sys

import numpy as np
import pytest

import ggml_py as gg

pytestmark = pytest.mark.skipif(
    sys.platform != "darwin" or "metal" not in gg.BUILD["backends"],
    reason="Metal builds and runs on macOS only")

N = int(os.environ.get("GGML_METAL_DEVICES", "1"))


def metal_devices():
    return [d for d in gg.devices() if d.name.startswith("MTL")]


def test_virtual_devices_enumerate():
    assert [d.name for d in metal_devices()] == [f"MTL{i}" for i in range(N)]


def test_buffer_types_are_named_per_device():
    for i, d in enumerate(metal_devices()):
        names = {b.name for b in d.buffer_types}
        assert f"MTL{i}" in names
        assert names <= {f"MTL{i}", f"MTL{i}_Private", f"MTL{i}_Mapped"} | {"CPU"}


def test_each_device_has_events():
    for d in metal_devices():
        assert d.caps.events
        with d.event() as ev, d.backend() as be:
            ev.record(be)
            ev.synchronize()


@pytest.mark.skipif(N < 2, reason="needs GGML_METAL_DEVICES >= 2")
def test_copy_async_mtl0_to_mtl1_ordered_by_event():
    d0, d1 = metal_devices()[:2]
    x = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)
    with d0.backend() as b0, d1.backend() as b1, gg.Context() as c0, gg.Context() as c1:
        a, b = c0.from_numpy(x), c1.from_numpy(x)
        c0.alloc(b0)
        c1.alloc(b1)
        b0.set_async(a, x)
        with d0.event() as ev:
            ev.record(b0)
            b1.wait(ev)
            gg.copy_async(a, b, b0, b1)
            b1.synchronize()
        assert np.array_equal(b.numpy(), x)
