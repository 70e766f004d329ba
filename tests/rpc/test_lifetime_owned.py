"""Ownership of every owned kind (CPU and RPC objects): idempotent close, closed objects
raise, children keep parents alive, weakrefs die, and create/close cycles do not leak."""
import gc
import weakref

import numpy as np
import pytest

import ggml_py as gg
from support import needs_release


def _owned(cpu, rpc_devs):
    yield "buffer", lambda: cpu.buffer_type.alloc(1024)
    yield "backend", lambda: cpu.backend()
    yield "event", lambda: rpc_devs[0].event()
    yield "context", lambda: gg.Context()
    yield "rpc backend", lambda: rpc_devs[0].backend()
    yield "rpc buffer", lambda: rpc_devs[0].buffer_type.alloc(1024)


@needs_release("0.23.0", "events on RPC devices")
def test_weakrefs_die_after_gc(cpu, rpc_devs):
    for what, make in _owned(cpu, rpc_devs):
        obj = make()
        ref = weakref.ref(obj)
        del obj
        gc.collect()
        assert ref() is None, what


@needs_release("0.23.0", "events on RPC devices")
def test_close_is_idempotent_and_closed_objects_raise(cpu, rpc_devs):
    for what, make in _owned(cpu, rpc_devs):
        obj = make()
        obj.close()
        obj.close()
        assert obj.closed
        with pytest.raises(gg.ClosedError, match="closed"):
            obj.ptr
        with pytest.raises(gg.ClosedError, match="closed"):
            with obj:
                pass


@needs_release("0.23.0", "events on RPC devices")
def test_closed_objects_raise_on_use(cpu, rpc_devs):
    be = cpu.backend(); be.close()
    with pytest.raises(gg.ClosedError, match="closed"):
        be.synchronize()
    buf = cpu.buffer_type.alloc(64); buf.close()
    with pytest.raises(gg.ClosedError, match="closed"):
        buf.clear(0)
    ev = rpc_devs[0].event(); ev.close()
    with pytest.raises(gg.ClosedError, match="closed"):
        ev.synchronize()


def test_tensor_keeps_its_context_and_memory_alive(cpu):
    be = cpu.backend()
    ctx = gg.Context()
    t = ctx.tensor(gg.f32, (4,))
    ctx.alloc(be)
    t.set(np.arange(4, dtype=np.float32))
    ref = weakref.ref(ctx)
    del ctx
    gc.collect()
    assert ref() is not None
    assert t.numpy().tolist() == [0, 1, 2, 3]


def test_closing_a_context_closes_its_buffers_and_tensors_raise(cpu):
    with cpu.backend() as be:
        ctx = gg.Context()
        t = ctx.tensor(gg.f32, (4,))
        (buf,) = ctx.alloc(be)
        ctx.close()
        assert buf.closed
        with pytest.raises(gg.ClosedError, match="closed"):
            t.numpy()


def test_zero_copy_view_keeps_memory_alive(cpu):
    with cpu.backend() as be:
        ctx = gg.Context()
        t = ctx.tensor(gg.f32, (1000,))
        ctx.alloc(be)
        t.set(np.full(1000, 2.0, np.float32))
        view = t.numpy()
        assert view.ctypes.data == t.data      # zero copy
        del ctx, t
        gc.collect()
        assert view.sum() == 2000.0


CYCLES = """
import gc, json, psutil, ggml_py as gg
srv = gg.rpc.serve()
cpu, rpc = gg.device("CPU"), gg.rpc.connect(srv.endpoint).devices[0]
proc = psutil.Process()

def growth(make, n=100_000):
    for _ in range(2000):        # warm up allocator pools
        make().close()
    gc.collect()
    before = proc.memory_info().rss
    for _ in range(n):
        make().close()
    gc.collect()
    return proc.memory_info().rss - before

makers = [("buffer", lambda: cpu.buffer_type.alloc(256)), ("backend", cpu.backend)]
if rpc.caps.events:                   # RPC events (ggml 0.23.0+): a round trip each way
    makers.append(("event", rpc.event))
out = {what: growth(make) for what, make in makers}
srv.close()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_create_close_cycles_do_not_grow_rss():
    # In a fresh process: RSS inside the long test session also moves with whatever earlier
    # tests left in the allocator (OpenMP worker threads among them).
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    grown = json.loads(r.stdout.strip().splitlines()[-1])
    for what, n in grown.items():
        assert n < 5 * 2**20, f"{what}: RSS grew by {n / 2**20:.1f} MiB over 100,000 cycles"
