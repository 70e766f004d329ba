"""Two devices of one accelerator registry (CUDA0 and CUDA1; Metal's virtual MTL0 and MTL1):
an event recorded on one orders a copy_async into the other (the peer-copy path), and the
scheduler splits a graph over both with the single-device result. Skipped where fewer than two
such devices exist (CI, a one-GPU machine)."""
import numpy as np
import pytest

import ggml_py as gg
from support import LayerStack, nmse, producer_rows


def _pairs():
    by_reg = {}
    for d in gg.devices():
        if d.type in ("gpu", "igpu") and not d.registry.name.startswith("RPC"):
            by_reg.setdefault(d.registry.name, []).append(d.name)
    return [tuple(names[:2]) for names in by_reg.values() if len(names) >= 2]


PAIRS = _pairs()
pytestmark = pytest.mark.skipif(not PAIRS, reason="needs two devices of one GPU backend")


@pytest.fixture(params=PAIRS or [("none", "none")], ids=lambda p: "-".join(p))
def pair(request):
    return [gg.device(n) for n in request.param]


def test_both_enumerate_with_their_buffer_types(pair):
    d0, d1 = pair
    assert d0 != d1 and d0.registry == d1.registry
    assert d0.buffer_type != d1.buffer_type
    for d in pair:
        assert d.caps.events and d.caps.async_
        assert d.buffer_type.device == d


def test_events_order_a_copy_between_two_devices(pair, rng):
    """Device 0 computes `out` for milliseconds while device 1 reads `dst` for milliseconds;
    then `out` is copied into `dst`. The copy must wait for both: for device 0's writes (read
    after write) and for device 1's reads (write after read). ggml queues the copy on one of
    the two queues, which one depends on the backend (CUDA: the source's stream, which then
    makes the destination wait; Vulkan: the destination's queue), so the queue it lands on
    orders one side and only an event orders the other. Each device records an event and the
    other waits on it. The test runs twice, once with the reader three times longer than the
    writer and once the other way round: whichever queue the copy lands on, one round has the
    other side still running when the copy is queued, so with the record or the wait removed
    that round sees the wrong values and the test fails (tools/mutate_events.py shows it; on
    the H200 one round with equal lengths passed mutated, the reader having finished first)."""
    d0, d1 = pair
    rows = producer_rows(d0)
    x = rng.integers(-8, 8, (rows, 1024)).astype(np.float32)  # exact sums
    old = x - 1
    with d0.backend() as b0, d1.backend() as b1, gg.Context() as c0, gg.Context() as c1:
        a = c0.from_numpy(x)
        out = c0.tensor(gg.f32, x.shape)
        c0.alloc(b0)
        dst = c1.from_numpy(old)
        res = c1.tensor(gg.f32, x.shape)
        c1.alloc(b1)
        for n_write, n_read in ((100, 300), (300, 100)):
            chain = a
            for _ in range(n_write):                   # device 0 writes `out` at the end
                chain = chain + a
            writer = gg.Graph(gg.cpy(chain, out))
            reader = dst
            for _ in range(n_read):                    # device 1 reads `dst` throughout
                reader = reader + dst
            reading = gg.Graph(gg.cpy(reader, res))
            b0.compute(writer)                         # warm-up: kernels loaded on both devices
            b1.compute(reading)
            b1.set(dst, old)
            b0.set_async(out, np.full(x.shape, np.nan, np.float32))
            b0.compute_async(writer)
            b1.compute_async(reading)
            with d0.event() as e0, d1.event() as e1:
                e0.record(b0)
                e1.record(b1)
                b1.wait(e0)
                b0.wait(e1)
                gg.copy_async(out, dst, b0, b1)
                b0.synchronize()
                b1.synchronize()
            where = f"writer {n_write} adds, reader {n_read}"
            assert np.array_equal(res.numpy(), old * (n_read + 1)), where  # reader saw `old`
            assert np.array_equal(dst.numpy(), x * (n_write + 1)), where   # copy saw all `out`


def test_scheduler_splits_a_stack_over_both(pair, cpu):
    d0, d1 = pair
    results, counts = {}, {}
    for mode in ("one", "two"):
        b0, b1, bc = d0.backend(), d1.backend(), cpu.backend()
        homes = [b0, b1, b0, b1] if mode == "two" else [b0] * 4
        stack = LayerStack(homes, b0, np.random.default_rng(4), rows=64, width=256)
        bes = [b0, b1, bc] if mode == "two" else [b0, bc]
        with gg.Scheduler(bes) as sched:
            sched.compute(gg.Graph(stack.out))
            results[mode] = stack.out.numpy(copy=True)
            counts[mode] = (sched.n_splits, sched.n_copies)
        stack.close()
        for b in (b0, b1, bc):
            b.close()
    assert counts["one"][0] == 1
    assert counts["two"][0] >= 4 and counts["two"][1] >= 1   # one split per layer at least
    assert nmse(results["two"], results["one"]) < 1e-10
    assert nmse(results["one"], stack.ref) < 5e-4
