"""Tests written against mutants that no CPU or RPC test can observe (docs/mutation.md, group
C of the census): what a device with queues of its own (CUDA; each backend a stream) shows.
They skip on a build without CUDA (CI runs CPU and RPC only) and ran on the GPU machine.

The waits: a long graph queued with compute_async, then the call that must wait for it, then
the output read directly (a CUDA read goes through another stream, so it does not wait for
the compute): a missing synchronize shows LongWriter's NaN sentinel."""
import re

import numpy as np
import pytest

import ggml_py as gg
from support import LongWriter

CUDA = [d.name for d in gg.devices() if d.registry.name == "CUDA"]
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA build and GPU")


@pytest.fixture(params=CUDA[:1] or ["none"])
def single(request):
    return gg.device(request.param)


@pytest.fixture
def pair():
    if len(CUDA) < 2:
        pytest.skip("needs two CUDA devices (GGML_CUDA_DEVICES=2)")
    return [gg.device(n) for n in CUDA[:2]]


def _stale(got: np.ndarray) -> str:
    return f"{np.isnan(got).mean():.0%} still the sentinel"


def test_scheduler_synchronize_waits_for_the_long_graph(single, cpu, rng):
    with single.backend() as be, cpu.backend() as cb, gg.Context() as ctx:
        w = LongWriter(single, be, ctx, rng)
        with gg.Scheduler([be, cb]) as sched:
            sched.compute_async(w.graph)
            sched.synchronize()
            got = w.out.numpy(copy=True)
    assert np.array_equal(got, w.expected), _stale(got)


def test_closing_a_scheduler_waits_for_its_work(single, cpu, rng):
    """A longer graph (1500 adds, ~0.1 s on an H100): closing a scheduler runs Python for a
    while before the read, which the 200 adds of the other tests did not outlast."""
    with single.backend() as be, cpu.backend() as cb, gg.Context() as ctx:
        w = LongWriter(single, be, ctx, rng, n_adds=1500)
        sched = gg.Scheduler([be, cb])
        sched.compute_async(w.graph)
        sched.close()
        got = w.out.numpy(copy=True)
    assert np.array_equal(got, w.expected), _stale(got)


def test_closing_a_backend_waits_for_its_work(single, rng):
    with gg.Context() as ctx:
        be = single.backend()
        w = LongWriter(single, be, ctx, rng)
        be.compute_async(w.graph)
        be.close()
        got = w.out.numpy(copy=True)
    assert np.array_equal(got, w.expected), _stale(got)


def test_closing_an_event_finishes_the_queues_waiting_on_it(pair, rng):
    """Backend 1 waits on an event of backend 0's long graph, then queues its own long graph:
    closing the event synchronizes backend 1 first (a queue left waiting on a freed event may
    hang), so its output is complete right after the close."""
    d0, d1 = pair
    with d0.backend() as b0, d1.backend() as b1, gg.Context() as c0, gg.Context() as c1:
        w0, w1 = LongWriter(d0, b0, c0, rng), LongWriter(d1, b1, c1, rng)
        b0.compute_async(w0.graph)
        ev = d0.event()
        ev.record(b0)
        b1.wait(ev)
        b1.compute_async(w1.graph)
        ev.close()
        got = w1.out.numpy(copy=True)
        b0.synchronize()
    assert np.array_equal(got, w1.expected), _stale(got)


def test_a_cuda_device_names_its_pci_bus(single):
    assert re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7](-v\d+)?",
                        single.device_id.lower()), single.device_id


def test_a_cuda_device_has_pinned_host_memory(single):
    host = single.host_buffer_type
    assert host is not None and host.is_host and host.name.startswith("CUDA_Host")
    assert host.name in [b.name for b in single.buffer_types]


@pytest.mark.parametrize("batch, offloaded", [(1, False), (31, False), (32, True), (64, True)])
def test_offload_op_follows_the_batch_size(single, batch, offloaded):
    """ggml's scheduler moves a matmul to CUDA from 32 rows of activations on (the default of
    GGML_OP_OFFLOAD_MIN_BATCH)."""
    with gg.Context() as ctx:
        y = gg.mul_mat(ctx.tensor(gg.f32, (16, 8)), ctx.tensor(gg.f32, (batch, 8)))
        assert single.offload_op(y) is offloaded


def test_dlpack_names_the_cuda_device(single):
    """__dlpack_device__ of CUDA memory is (kDLCUDA=2, the CUDA device's index)."""
    with single.backend() as be, gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (4,))
        ctx.alloc(be)
        assert t.__dlpack_device__() == (2, int(single.name[4:]))
