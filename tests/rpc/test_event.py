"""Events: record on one backend, wait on another, synchronize on the host."""
import numpy as np
import pytest

import ggml_py as gg
from support import needs_release
from support.sentinel import assert_bytes, unlike

rpc_events = needs_release("0.23.0", "events on RPC devices")


def test_cpu_has_no_events(cpu):
    with pytest.raises(gg.UnsupportedError, match="no events"):
        cpu.event()


@rpc_events
def test_event_lifecycle(rpc_devs):
    d = rpc_devs[0]
    with d.backend() as be, d.event() as ev:
        assert ev.device is d
        ev.record(be)
        be.wait(ev)
        ev.synchronize()
    assert ev.closed
    with pytest.raises(gg.ClosedError, match="closed"):
        ev.synchronize()


@rpc_events
def test_event_recorded_on_one_rpc_backend_waited_on_by_another(rpc_devs, rng):
    d0, d1 = rpc_devs
    x = rng.standard_normal(4096).astype(np.float32)
    with d0.backend() as b0, d1.backend() as b1, gg.Context() as c0, gg.Context() as c1:
        a, b = c0.from_numpy(unlike(x)), c1.from_numpy(unlike(x))
        c0.alloc(b0)
        c1.alloc(b1)
        b0.set_async(a, x)
        ev = d0.event()
        ev.record(b0)
        b1.wait(ev)           # RPC1's queue waits for RPC0's event
        gg.copy_async(a, b, b0, b1)
        b1.synchronize()
        assert_bytes(b.numpy(), x, unlike(x))
        ev.close()


@rpc_events
def test_record_on_another_device_raises(rpc_devs):
    with rpc_devs[0].event() as ev, rpc_devs[1].backend() as be:
        with pytest.raises(gg.InvalidArgument, match="cannot be recorded"):
            ev.record(be)


@rpc_events
def test_event_closed_while_a_backend_waits_on_it(rpc_devs, rng):
    d = rpc_devs[0]
    x = rng.standard_normal(4096).astype(np.float32)
    with d.backend() as b0, d.backend() as b1, gg.Context() as ctx:
        a, b = ctx.from_numpy(unlike(x)), ctx.from_numpy(unlike(x))
        ctx.alloc(b0)
        b0.set_async(a, x)
        ev = d.event()
        ev.record(b0)
        b1.wait(ev)
        assert ev in b1._pending           # kept alive while b1's queue may wait on it
        gg.copy_async(a, b, b0, b1)
        ev.close()                         # waits for b1's queue first
        b1.synchronize()
        assert_bytes(b.numpy(), x, unlike(x))
        assert not b1._pending
