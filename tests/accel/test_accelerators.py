"""Local accelerators (CUDA, Vulkan, Metal: whatever this build and machine have): enumeration,
two backends of one device ordered by events, async round trips, copies to and from the CPU,
the scheduler splitting a graph between the device and the CPU, ops against the CPU.
Everything here skips on a machine with no such device (CI runs CPU and RPC only)."""
import subprocess
import sys

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import _vulkan
from support import LayerStack, child_env, nmse, producer_rows
from support.sentinel import assert_bytes, unlike

ACCEL = [d.name for d in gg.devices()
         if d.type in ("gpu", "igpu") and not d.registry.name.startswith("RPC")]
pytestmark = pytest.mark.skipif(not ACCEL, reason="no GPU device in this build/machine")


@pytest.fixture(params=ACCEL or ["none"])
def accel(request):
    return gg.device(request.param)


def _on(be, x, ctx=None):
    ctx = ctx or gg.Context()
    t = ctx.from_numpy(x)
    ctx.alloc(be)
    return ctx, t


def test_enumeration_and_buffer_types(accel):
    assert accel.caps.async_ and accel.caps.events
    names = [b.name for b in accel.buffer_types]
    assert names[0] == accel.buffer_type.name and not accel.buffer_type.is_host
    if accel.caps.host_buffer:
        host = accel.host_buffer_type
        assert host.is_host and host.name in names
        buf = host.alloc(1 << 20)
        assert buf.is_host and buf.size >= 1 << 20
        buf.close()
    buf = accel.buffer_type.alloc(1 << 20)
    assert buf.size >= 1 << 20 and not buf.is_host
    buf.close()
    free, total = accel.memory
    assert 0 < free <= total


def test_two_backends_of_one_device_ordered_by_events(accel, rng):
    """Backend 0 computes a long chain that ends by writing `mid`; backend 1, a second queue on
    the same device, computes `mid + mid` once it has waited on an event recorded on backend 0.
    Only the event orders the two queues (ggml queues a copy between two backends on the
    source's stream, so a test that ends in `copy_async` is ordered by ggml itself and cannot
    notice a missing event; this one can). `mid` starts as NaN, so a consumer that runs early
    reads NaN or a half-written row: with the record or the wait removed the test fails
    (tools/mutate_events.py) on CUDA, whose backends each have a stream of their own.
    Vulkan's and Metal's backends submit to their device's one queue, which orders the two
    with or without the event: there the test could not fail (on lavapipe it passed with the
    wait and with the record removed), so it does not run there (Metal's equivalent that can
    fail is tests/accel/test_metal.py's event synchronize test)."""
    if accel.registry.name in ("Vulkan", "MTL", "Metal"):
        pytest.skip(f"{accel.name}: two backends of one device share the device's queue, "
                    "which orders them without the event (this test could not fail here)")
    x = rng.integers(-8, 8, (producer_rows(accel), 1024)).astype(np.float32)  # exact sums
    n = 60
    with accel.backend() as b0, accel.backend() as b1, gg.Context() as ctx:
        a = ctx.from_numpy(x)
        mid = ctx.tensor(gg.f32, x.shape)
        res = ctx.tensor(gg.f32, x.shape)
        ctx.alloc(b0)
        b0.set_async(mid, np.full(x.shape, np.nan, np.float32))
        b0.set_async(a, x)
        out = gg.relu(a)
        for _ in range(n):
            out = out + a
        producer = gg.Graph(gg.cpy(out, mid))
        consumer = gg.Graph(gg.cpy(mid + mid, res))         # reads only `mid` (a leaf)
        b0.compute(producer)        # warm-up: the first run loads kernels or builds pipelines
        b1.compute(consumer)        # on the host, long enough to hide a missing event
        b0.set_async(mid, np.full(x.shape, np.nan, np.float32))
        b0.compute_async(producer)                          # producer: b0's queue
        with accel.event() as ev:
            ev.record(b0)
            b1.wait(ev)
            b1.compute_async(consumer)                      # b1's queue: ordered by the event
            b1.synchronize()
        b0.synchronize()
        assert np.array_equal(res.numpy(), 2 * (np.maximum(x, 0) + n * x))


def test_async_set_get_round_trip(accel, rng):
    x = rng.standard_normal(1 << 20).astype(np.float32)
    y = unlike(x)
    with accel.backend() as be:
        ctx, t = _on(be, unlike(x))         # set_async and get_async must change every byte
        be.set_async(t, x)
        be.get_async(t, y)
        be.synchronize()
        assert_bytes(y, x, unlike(x))
        ctx.close()


CROSS = [(a, b) for a in ACCEL for b in ACCEL
         if gg.device(a).registry != gg.device(b).registry]


@pytest.mark.skipif(not CROSS, reason="needs accelerators of two kinds (CUDA0 and Vulkan0)")
@pytest.mark.parametrize("names", CROSS or [("none", "none")], ids=lambda p: "->".join(p))
def test_copy_between_two_kinds_of_device_is_byte_identical(names, rng):
    """A copy between, say, CUDA0 and Vulkan0 has no native path: ggml synchronizes both
    backends and copies through the host. Every byte arrives, NaN payloads included."""
    bits = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    d0, d1 = (gg.device(n) for n in names)
    with d0.backend() as b0, d1.backend() as b1:
        c0, s = _on(b0, x)
        c1, d = _on(b1, np.zeros_like(x))
        gg.copy_async(s, d, b0, b1)
        b0.synchronize()
        b1.synchronize()
        assert np.array_equal(d.numpy(copy=True).view(np.uint32), bits)
        c0.close()
        c1.close()


@pytest.mark.parametrize("direction", ["cpu->device", "device->cpu"])
def test_copy_async_between_cpu_and_device(accel, cpu, rng, direction):
    x = rng.standard_normal((64, 64)).astype(np.float32)
    with accel.backend() as gb, cpu.backend() as cb:
        (sb, db) = (cb, gb) if direction == "cpu->device" else (gb, cb)
        cs, s = _on(sb, unlike(x))
        cd, d = _on(db, unlike(x))          # the copy must change every byte
        s.set(x)
        gg.copy_async(s, d, sb, db)
        db.synchronize()
        assert_bytes(d.numpy(), x, unlike(x))
        cs.close()
        cd.close()


def test_scheduler_splits_between_device_and_cpu(accel, cpu):
    """Layers alternate between the device and the CPU; the result equals the CPU alone's."""
    results = {}
    for mode in ("cpu", "split"):
        dev_be, cpu_be = accel.backend(), cpu.backend()
        homes = [dev_be, cpu_be] * 2 if mode == "split" else [cpu_be] * 4
        stack = LayerStack(homes, cpu_be, np.random.default_rng(3), rows=32, width=128)
        with gg.Scheduler([dev_be, cpu_be]) as sched:
            sched.compute(gg.Graph(stack.out))
            results[mode] = stack.out.numpy(copy=True)
            if mode == "split":
                assert sched.n_splits >= 2 and sched.n_copies >= 1
        stack.close()
        dev_be.close()
        cpu_be.close()
    assert nmse(results["split"], results["cpu"]) < 5e-4


def _rope_inputs(rng):
    return (rng.standard_normal((1, 6, 4, 64)).astype(np.float32), np.arange(6, dtype=np.int32))


CASES = {
    # name: (inputs(rng), build, threshold): test-backend-ops' thresholds, device vs CPU
    "mul_mat f32": (lambda r: (r.standard_normal((96, 64)).astype(np.float32),
                               r.standard_normal((80, 64)).astype(np.float32)), gg.mul_mat, 5e-4),
    "mul_mat f16": (lambda r: (r.standard_normal((96, 64)).astype(np.float16),
                               r.standard_normal((80, 64)).astype(np.float32)), gg.mul_mat, 5e-4),
    "add": (lambda r: (r.standard_normal((4, 33)).astype(np.float32),) * 2, gg.add, 1e-7),
    "soft_max": (lambda r: (r.standard_normal((8, 100)).astype(np.float32),), gg.soft_max, 1e-6),
    "rms_norm": (lambda r: (r.standard_normal((8, 100)).astype(np.float32),), gg.rms_norm, 1e-7),
    "silu": (lambda r: (r.standard_normal((8, 100)).astype(np.float32),), gg.silu, 1e-7),
    "rope_ext": (_rope_inputs, lambda a, p: gg.rope_ext(a, p, mode=gg.ROPE_NEOX), 1e-7),
    "argsort": (lambda r: (r.standard_normal((4, 64)).astype(np.float32),), gg.argsort, 0),
    "flash_attn_ext": (lambda r: (r.standard_normal((1, 4, 8, 64)).astype(np.float32),
                                  r.standard_normal((1, 4, 32, 64)).astype(np.float16),
                                  r.standard_normal((1, 4, 32, 64)).astype(np.float16)),
                       lambda q, k, v: gg.flash_attn_ext(q, k, v, scale=0.125), 5e-4),
}


def _compute(dev, inputs, build):
    with dev.backend() as be, gg.Context() as ctx:
        ts = [ctx.from_numpy(x) for x in inputs]
        ctx.alloc(be)
        for t, x in zip(ts, inputs):
            t.set(x)
        out = build(*ts)
        if not be.supports_op(out):
            pytest.skip(f"{dev.name} does not support this op")
        be.compute(gg.Graph(out))
        return out.numpy(copy=True)


@pytest.mark.parametrize("case", list(CASES))
def test_ops_match_the_cpu(accel, cpu, case):
    make, build, threshold = CASES[case]
    inputs = make(np.random.default_rng(5))
    got, ref = _compute(accel, inputs, build), _compute(cpu, inputs, build)
    assert got.shape == ref.shape
    if threshold == 0:
        assert np.array_equal(got, ref)
    else:
        assert nmse(got, ref) < threshold


def test_event_closed_before_the_waiting_backend_synchronizes(accel, rng):
    """`with dev.event()` ending before the waiting queue drained: ggml would free an event
    that queue still waits on (the queue hung on Vulkan); the close waits for it instead."""
    x = rng.standard_normal(1 << 16).astype(np.float32)
    with accel.backend() as b0, accel.backend() as b1, gg.Context() as ctx:
        a, dst = ctx.from_numpy(unlike(x)), ctx.from_numpy(unlike(x))
        ctx.alloc(b0)
        b0.set_async(a, x)
        with accel.event() as ev:
            ev.record(b0)
            b1.wait(ev)
            gg.copy_async(a, dst, b0, b1)
        b1.synchronize()
        assert_bytes(dst.numpy(), x, unlike(x))


VULKAN = [n for n in ACCEL if n.startswith("Vulkan")]


@pytest.mark.parametrize("spec", ["{n}", "0,{n}", "-1", "{n}x", "0 1 2 3 4 5 6 7 8 9 99",
                                  "0,0", "x,99", "", "0"])
@pytest.mark.parametrize("dev", VULKAN[:1] or ["Vulkan0"])
def test_a_visible_vulkan_device_that_is_not_there_is_an_import_error(dev, spec):
    """ggml's Vulkan registry throws on a GGML_VK_VISIBLE_DEVICES index past the loader's
    devices, and the process dies (a segmentation fault on the H200). ggml_py reads the value
    by ggml's rules first: an index that is not there is an ImportError naming the variable,
    anything else imports; no value ends the process (but for NVIDIA's driver, where ggml
    fails on every value that names a device: skipped, saying so)."""
    if not VULKAN:
        pytest.skip("needs a build with Vulkan and a Vulkan device")
    types = _vulkan.physical_device_types()
    assert types, "the loader reports the devices ggml found"
    value = spec.format(n=len(types))
    bad = any(i >= len(types) for i in _vulkan.visible_indices(value))
    if not bad and _vulkan.visible_indices(value) and "NVIDIA" in gg.device(dev).description:
        pytest.skip("with NVIDIA's Vulkan driver (H200, driver 580) ggml-vulkan ends the process "
                    "on any GGML_VK_VISIBLE_DEVICES that names a device, even one the loader "
                    "reports (docs/upstream-issues.md section 11): not ggml_py's to catch")
    r = subprocess.run([sys.executable, "-c", "import ggml_py as gg; print(len(gg.devices()))"],
                       env=child_env(GGML_VK_VISIBLE_DEVICES=value), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode in (0, 1), (value, r.returncode, r.stderr[-2000:])
    if bad:
        assert r.returncode == 1 and "ImportError" in r.stderr, (value, r.stderr[-2000:])
        assert "GGML_VK_VISIBLE_DEVICES" in r.stderr and "would end the process" in r.stderr
    else:
        assert r.returncode == 0, (value, r.stderr[-2000:])
