"""copy_async between backends of every pair of devices."""
import itertools

import numpy as np
import pytest

import ggml_py as gg
from support import DEVICE_NAMES, device_of
from support.sentinel import assert_bytes, unlike


def _tensor_on(dev, be, x):
    """A tensor on `be` holding unlike(x): every byte differs from what a copy must bring."""
    ctx = gg.Context()
    t = ctx.from_numpy(unlike(x))
    ctx.alloc(be)
    assert_bytes(t.numpy(), unlike(x))
    return ctx, t


@pytest.mark.parametrize("src_name, dst_name", list(itertools.product(DEVICE_NAMES, repeat=2)))
def test_copy_async_every_pair(rpc_servers, src_name, dst_name, rng):
    src_dev, dst_dev = device_of(src_name, rpc_servers), device_of(dst_name, rpc_servers)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    with src_dev.backend() as sb, dst_dev.backend() as db:
        cs, s = _tensor_on(src_dev, sb, x)
        cd, d = _tensor_on(dst_dev, db, x)
        sb.set_async(s, x)
        if src_dev.caps.events and dst_dev.registry == src_dev.registry:
            with src_dev.event() as ev:
                ev.record(sb)
                db.wait(ev)
                gg.copy_async(s, d, sb, db)
                db.synchronize()
        else:
            sb.synchronize()
            gg.copy_async(s, d, sb, db)
            db.synchronize()
        assert_bytes(s.numpy(), x, unlike(x))     # set_async wrote the source
        assert_bytes(d.numpy(), x, unlike(x))     # the copy wrote the destination
        cs.close()
        cd.close()


def test_copy_chain_cpu_rpc0_rpc1_cpu(cpu, rpc_devs, rng):
    x = rng.integers(0, 255, 1 << 20, dtype=np.uint8).view(np.int8)
    devs = [cpu, rpc_devs[0], rpc_devs[1], cpu]
    bes = [d.backend() for d in devs]
    ctxs, ts = zip(*[_tensor_on(d, b, x) for d, b in zip(devs, bes)])
    ts[0].set(x)
    for i in range(3):               # every hop's destination starts as unlike(x)
        gg.copy_async(ts[i], ts[i + 1], bes[i], bes[i + 1])
        bes[i + 1].synchronize()
        assert_bytes(ts[i + 1].numpy(), x, unlike(x))
    for c in ctxs:
        c.close()
    for b in bes:
        b.close()
