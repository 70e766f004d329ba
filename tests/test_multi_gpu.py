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
    """Device 1 reads `dst` for milliseconds (a long chain of adds); device 0 then copies new
    values into `dst`. ggml queues a copy between devices on the source's stream (device 0),
    where nothing waits for device 1's reads: only an event recorded on device 1 and waited on
    by device 0 keeps the copy from overwriting `dst` while the chain still reads it. With the
    record or the wait removed the chain sees the new values and the test fails
    (tools/mutate_events.py shows it). This is the ordering ggml's scheduler needs before it
    overwrites a split's inputs."""
    d0, d1 = pair
    rows = producer_rows(d0)
    old = rng.integers(-8, 8, (rows, 1024)).astype(np.float32)  # exact sums
    new = old + 1
    n = 200
    with d0.backend() as b0, d1.backend() as b1, gg.Context() as c0, gg.Context() as c1:
        src = c0.from_numpy(new)
        c0.alloc(b0)
        dst = c1.from_numpy(old)
        res = c1.tensor(gg.f32, old.shape)
        c1.alloc(b1)
        out = dst
        for _ in range(n):                         # device 1 reads dst throughout
            out = out + dst
        b1.compute_async(gg.Graph(gg.cpy(out, res)))
        with d1.event() as ev:
            ev.record(b1)
            b0.wait(ev)
            gg.copy_async(src, dst, b0, b1)       # ggml queues it on device 0's stream
            b0.synchronize()
            b1.synchronize()
        assert np.array_equal(res.numpy(), old * (n + 1))   # the chain saw only the old values
        assert np.array_equal(dst.numpy(), new)


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
