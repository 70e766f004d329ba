"""Two devices of one accelerator registry (CUDA0 and CUDA1; Metal's virtual MTL0 and MTL1):
an event recorded on one orders a copy_async into the other (the peer-copy path), and the
scheduler splits a graph over both with the single-device result. Skipped where fewer than two
such devices exist (CI, a one-GPU machine)."""
import numpy as np
import pytest

import ggml_py as gg
from conftest import LayerStack, nmse, producer_rows


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


def test_event_on_one_orders_a_copy_into_the_other(pair, rng):
    """Device 0 gets a long chain of work (milliseconds, far longer than Python takes to queue
    the copy), so a copy not ordered by the event would read `out` before it is computed: this
    test fails when the record or the wait is removed (tools/gpu/mutate_events.py shows it)."""
    d0, d1 = pair
    x = rng.integers(-8, 8, (producer_rows(d0), 1024)).astype(np.float32)  # exact sums
    n = 200
    with d0.backend() as b0, d1.backend() as b1, gg.Context() as c0, gg.Context() as c1:
        a = c0.from_numpy(x)
        c0.alloc(b0)
        dst = c1.tensor(gg.f32, x.shape)
        c1.alloc(b1)
        b0.set_async(a, x)
        out = a
        for _ in range(n):                         # work on device 0 the copy must wait for
            out = out + a
        b0.compute_async(gg.Graph(out))
        with d0.event() as ev:
            ev.record(b0)
            b1.wait(ev)
            gg.copy_async(out, dst, b0, b1)       # queued on device 1
            b1.synchronize()
        b0.synchronize()
        assert np.array_equal(dst.numpy(), x * (n + 1))


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
