"""Metal's virtual devices (GGML_METAL_DEVICES=N gives MTL0..MTL{N-1} on the one GPU), tests
that can fail there (issue 33). Not run on this project's Linux machines (no Metal): they run
on macOS (.github/workflows/macos.yml, GGML_METAL_DEVICES=2); the tests of `pair`/`single`
also run on a CUDA build (GGML_CUDA_DEVICES=2 gives CUDA0 and CUDA1 on one GPU), where the
same design applies and tools/mutate_events.py shows them failing.

Why the design (docs/metal.md): two backends of one Metal device share the device's in-order
queue, so an event between them cannot be observed; a copy between MTL0 and MTL1 is ordered
on both sides by ggml itself. What can fail: a long graph on one device, an event recorded
after it and synchronized (the event, not the backend), then the output read directly while
the backend may still run (a shared Metal buffer is read with memcpy, a CUDA buffer on
another stream): a missing record or synchronize shows the sentinel. Every destination
starts different from what the test expects."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ggml_py as gg
from support import RELEASE, LayerStack, LongWriter, child_env, nmse

METAL = sys.platform == "darwin" and "metal" in gg.BUILD["backends"]
#: Metal's virtual devices (PR 18919) first ship in ggml 0.9.7; before, one device "Metal"
VIRTUAL = RELEASE >= (0, 9, 7)
VAR = "GGML_METAL_DEVICES"

needs_metal = pytest.mark.skipif(
    not METAL, reason="Metal builds and runs on macOS only (not run on Linux machines)")
needs_virtual = pytest.mark.skipif(
    not VIRTUAL, reason=f"Metal's virtual devices (MTLi) arrived in ggml 0.9.7 "
                        f"(this build is {gg.ggml_version()})")


def metal_device_names(n: int) -> list[str]:
    """The devices of GGML_METAL_DEVICES=n, as the loaded release names them."""
    return [f"MTL{i}" for i in range(n)] if VIRTUAL else ["Metal"]


def metal_buffer_type_names(i: int) -> dict[str, str]:
    """Device i's buffer types by kind, as the release names them (0.20.2 and 0.26.0 read)."""
    base = f"MTL{i}" if VIRTUAL else "Metal"
    return {"shared": base, "private": base + "_Private", "mapped": base + "_Mapped"}


def _family(registry: str) -> list[gg.Device]:
    return [d for d in gg.devices() if d.registry.name == registry]


def _families() -> list[list[gg.Device]]:
    """Registries whose devices have queues of their own: Metal (MTL) on macOS, CUDA."""
    return [f for f in (_family("MTL") if METAL else [], _family("CUDA")) if f]


SINGLES = [f[0].name for f in _families()]
PAIRS = [(f[0].name, f[1].name) for f in _families() if len(f) >= 2]


@pytest.fixture(params=SINGLES or ["none"])
def single(request):
    if request.param == "none":
        pytest.skip("needs Metal (macOS) or CUDA")
    return gg.device(request.param)


@pytest.fixture(params=PAIRS or [("none", "none")], ids=lambda p: "-".join(p))
def pair(request):
    if request.param[0] == "none":
        pytest.skip(f"needs {VAR}>=2 on macOS, or two CUDA devices (GGML_CUDA_DEVICES=2)")
    return [gg.device(n) for n in request.param]


def require_direct_read(dev: gg.Device) -> None:
    """A read that does not wait for the device's queue: Metal's shared buffer type (a
    memcpy from the buffer); a private one is read by a blit on the device's queue, ordered
    after everything, where a missing record could not show."""
    if dev.registry.name == "MTL" and dev.buffer_type.name.endswith("_Private"):
        pytest.skip(f"{dev.name}'s default buffer type is {dev.buffer_type.name}: its reads "
                    "go through the device's queue and cannot show stale values")


# -- one device ------------------------------------------------------------------------------

def test_event_synchronize_waits_for_the_long_graph(single, rng):
    """Record after the graph, synchronize the EVENT, read directly: all adds are in."""
    require_direct_read(single)
    with single.backend() as be, gg.Context() as ctx:
        w = LongWriter(single, be, ctx, rng)
        be.compute_async(w.graph)
        with single.event() as ev:
            ev.record(be)
            ev.synchronize()
            got = w.out.numpy(copy=True)
        be.synchronize()
    assert np.array_equal(got, w.expected), f"{np.isnan(got).mean():.0%} still the sentinel"


# -- two devices of one GPU --------------------------------------------------------------------

def test_an_event_of_one_device_orders_the_other(pair, rng):
    """MTL1 waits on MTL0's event, records its own, and the host synchronizes only MTL1's:
    without the wait (or the record) MTL1's queue signals at once and the read is stale."""
    d0, d1 = pair
    require_direct_read(d0)
    with d0.backend() as b0, d1.backend() as b1, gg.Context() as ctx:
        w = LongWriter(d0, b0, ctx, rng)
        b0.compute_async(w.graph)
        with d0.event() as e0, d1.event() as e1:
            e0.record(b0)
            b1.wait(e0)
            e1.record(b1)
            e1.synchronize()
            got = w.out.numpy(copy=True)
        b0.synchronize()
    assert np.array_equal(got, w.expected), f"{np.isnan(got).mean():.0%} still the sentinel"


@pytest.mark.parametrize("way", ["0to1", "1to0"])
def test_copy_async_after_a_long_graph(pair, way, rng):
    """copy_async of a tensor a long graph is still writing, into a sentinel destination on
    the other device; only the destination's backend is synchronized before the read (ggml
    orders both sides: Metal's copy waits for the destination's queue and makes it wait for
    the blit; CUDA queues it on the source's stream and makes the destination wait)."""
    src_dev, dst_dev = pair if way == "0to1" else pair[::-1]
    require_direct_read(dst_dev)
    with src_dev.backend() as bs, dst_dev.backend() as bd, \
            gg.Context() as cs, gg.Context() as cd:
        w = LongWriter(src_dev, bs, cs, rng)
        dst = cd.tensor(gg.f32, w.x.shape)
        cd.alloc(bd)
        bd.set(dst, np.full(w.x.shape, -1.0, np.float32))      # not what the copy brings
        bs.compute_async(w.graph)
        gg.copy_async(w.out, dst, bs, bd)
        bd.synchronize()
        got = dst.numpy(copy=True)
        bs.synchronize()
    assert np.array_equal(got, w.expected), (
        f"{(got == -1).mean():.0%} never copied, {np.isnan(got).mean():.0%} copied too early")


def test_scheduler_across_both_devices_and_the_cpu(pair, cpu):
    """Layers alternate between the two devices, the input lives on the CPU: the scheduler
    splits per layer and copies between all three; the result equals one device's."""
    d0, d1 = pair
    results, counts = {}, {}
    for mode in ("one", "three"):
        b0, b1, bc = d0.backend(), d1.backend(), cpu.backend()
        homes = [b0, b1, b0, b1] if mode == "three" else [b0] * 4
        stack = LayerStack(homes, bc, np.random.default_rng(5), rows=64, width=256)
        with gg.Scheduler([b0, b1, bc]) as sched:
            sched.compute(gg.Graph(stack.out))
            results[mode] = stack.out.numpy(copy=True)
            counts[mode] = sched.n_splits
        ref = stack.ref
        stack.close()
        for b in (b0, b1, bc):
            b.close()
    assert counts["three"] >= 4 > counts["one"], counts     # one split per layer at least
    assert nmse(results["three"], results["one"]) < 1e-10
    assert nmse(results["three"], ref) < 5e-4


# -- Metal only: device lists, buffer types, the GGML_METAL_DEVICES guard (child processes) ---

CHILD = r"""
import json, os, sys
import numpy as np
import ggml_py as gg
from ggml_py.__main__ import matmul_check
out = {"devices": []}
for d in gg.devices():
    if d.registry.name not in ("MTL", "Metal"):
        continue
    # a whole page (16 KiB on Apple Silicon): ggml maps whole pages of the host memory
    host = gg.aligned_empty((4096,), np.float32, alignment=16384)
    mapped = d.buffer_from_host(host) if d.caps.buffer_from_host_ptr else None
    free, total = d.memory
    out["devices"].append({
        "name": d.name, "description": d.description, "type": d.type, "total": total,
        "caps": {"async": d.caps.async_, "events": d.caps.events,
                 "from_host": d.caps.buffer_from_host_ptr, "host_buffer": d.caps.host_buffer},
        "buffer_type": d.buffer_type.name,
        "buffer_type_device": d.buffer_type.device.name if d.buffer_type.device else None,
        "buffer_types": [b.name for b in d.buffer_types],
        "mapped": mapped.buffer_type.name if mapped is not None else None})
last = [d for d in gg.devices() if d.registry.name in ("MTL", "Metal")][-1]
try:
    out["matmul"] = "ok" if matmul_check(last) < 5e-4 else "wrong"
except gg.UnsupportedError:
    out["matmul"] = "unsupported"       # a paravirtual GPU without simdgroup reduction
os.environ["GGML_METAL_DEVICES"] = str(len(out["devices"]) + 1)
try:
    gg.devices()
    out["guard"] = None
except gg.UnsupportedError as e:
    out["guard"] = str(e)
print(json.dumps(out))
"""


def _child(n: int) -> dict:
    env = child_env(**{VAR: str(n)})
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_metal
@pytest.mark.parametrize("n", [1, 2, 4])
def test_virtual_devices_in_a_child(n):
    got = _child(n)
    devs = got["devices"]
    assert [d["name"] for d in devs] == metal_device_names(n)
    gpu = {d["description"].split(" (dev ")[0] for d in devs}
    assert len(gpu) == 1, gpu                                  # one GPU behind them all
    assert len({d["total"] for d in devs}) == 1                # memory not split
    for i, d in enumerate(devs):
        names = metal_buffer_type_names(i)
        assert d["type"] == "gpu"
        assert d["caps"] == {"async": True, "events": True, "from_host": True,
                             "host_buffer": False}
        assert d["buffer_type"] in (names["shared"], names["private"])
        assert d["buffer_type_device"] == d["name"]
        assert set(d["buffer_types"]) <= {names["shared"], names["private"]}
        assert d["mapped"] == names["mapped"]
        if n > 1 and RELEASE >= (0, 26, 0):
            assert d["description"].endswith(f"(dev p0/v{i})"), d["description"]
    assert got["matmul"] in ("ok", "unsupported")
    assert got["guard"] and f"{VAR} changed" in got["guard"]


@needs_metal
@needs_virtual
def test_this_process_sees_the_count_it_was_started_with():
    """The suite's own process: GGML_METAL_DEVICES as the workflow set it (default 1)."""
    n = int(os.environ.get(VAR, "1") or "1")
    assert [d.name for d in _family("MTL")] == metal_device_names(n)


@needs_metal
def test_changing_the_count_in_process_is_refused(monkeypatch):
    gg.devices()
    n = len(_family("MTL"))
    monkeypatch.setenv(VAR, str(n + 1))
    with pytest.raises(gg.UnsupportedError, match=f"{VAR} changed"):
        gg.devices()
    with pytest.raises(gg.UnsupportedError, match=f"{VAR} changed"):
        gg.device("CPU")


@needs_metal
@needs_virtual
def test_two_backends_of_one_device_share_its_queue(rng):
    """Why the event tests use two devices: on ONE Metal device two backends share the
    device's queue, so work on the second is ordered after the first's without any event.
    (A fact of ggml 0.26.0's Metal backend; if it changes, the design should be revisited.)"""
    d = _family("MTL")[0]
    require_direct_read(d)
    with d.backend() as b0, d.backend() as b1, gg.Context() as ctx:
        w = LongWriter(d, b0, ctx, rng)
        b0.compute_async(w.graph)
        with d.event() as ev:
            ev.record(b1)                # recorded on the OTHER backend of the same device
            ev.synchronize()
            got = w.out.numpy(copy=True)
        b0.synchronize()
    assert np.array_equal(got, w.expected)


@pytest.mark.skipif(not METAL or VIRTUAL, reason="the one-device naming of releases before 0.9.7")
def test_before_virtual_devices_the_device_is_metal():
    assert [d.name for d in gg.devices() if d.registry.name in ("MTL", "Metal")] == ["Metal"]
