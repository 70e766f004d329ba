"""Every mistake a user can make through the backend objects raises a Python exception with a
message, and the process and every other object stay usable."""
import numpy as np
import pytest

import ggml_py as gg


@pytest.fixture
def env(cpu, rpc_devs):
    be = cpu.backend()
    rb = rpc_devs[0].backend()
    ctx = gg.Context()
    a = ctx.tensor(gg.f32, (4, 8), "a")
    b = ctx.tensor(gg.f32, (4, 8), "b")
    c = ctx.tensor(gg.f16, (4, 8), "c")
    small = ctx.tensor(gg.f32, (4, 4), "small")
    ctx.alloc(be)
    rctx = gg.Context()
    r = rctx.tensor(gg.f32, (4, 8), "r")
    rctx.alloc(rb)
    unalloc_ctx = gg.Context()
    u = unalloc_ctx.tensor(gg.f32, (4, 8), "u")
    closed_ctx = gg.Context()
    z = closed_ctx.tensor(gg.f32, (4,), "z")
    closed_ctx.close()
    closed_be = cpu.backend()
    closed_be.close()
    e = dict(cpu=cpu, rpc=rpc_devs[0], be=be, rb=rb, ctx=ctx, a=a, b=b, c=c, small=small, r=r,
             u=u, z=z, closed_be=closed_be, x=np.ones((4, 8), np.float32))
    yield e
    ctx.close(); rctx.close(); unalloc_ctx.close(); be.close(); rb.close()


CASES = {
    "device name": (LookupError, lambda e: gg.device("GPU7")),
    "device index": (LookupError, lambda e: gg.device(42)),
    "device key type": (ValueError, lambda e: gg.device(1.5)),
    "device type": (ValueError, lambda e: gg.device(type="quantum")),
    "event on cpu": (gg.UnsupportedError, lambda e: e["cpu"].event()),
    "copy size differs": (ValueError, lambda e: gg.copy_async(e["a"], e["small"], e["be"], e["be"])),
    "copy type differs": (TypeError, lambda e: gg.copy_async(e["a"], e["c"], e["be"], e["be"])),
    "copy unallocated": (ValueError, lambda e: gg.copy_async(e["u"], e["a"], e["be"], e["be"])),
    "copy wrong backend": (ValueError, lambda e: gg.copy_async(e["r"], e["a"], e["be"], e["be"])),
    "set out of bounds": (ValueError, lambda e: e["a"].set(np.ones(40, np.uint8).view(np.uint8), offset=100, flat=True)),
    "set wrong dtype": (TypeError, lambda e: e["a"].set(np.ones((4, 8), np.float64))),
    "set wrong size": (ValueError, lambda e: e["a"].set(np.ones((4, 9), np.float32))),
    "set non-contiguous": (ValueError, lambda e: e["a"].set(np.ones((8, 4), np.float32).T)),
    "set not an array": (TypeError, lambda e: e["a"].set([1.0] * 32)),
    "get wrong size": (ValueError, lambda e: e["be"].get(e["a"], np.empty(31, np.float32))),
    "get read-only out": (ValueError, lambda e: e["be"].get(e["a"], np.frombuffer(bytes(128), np.float32).reshape(4, 8))),
    "set_async out of bounds": (ValueError, lambda e: e["rb"].set_async(e["r"], np.ones(64, np.uint8), offset=120, flat=True)),
    "set_async wrong dtype": (TypeError, lambda e: e["rb"].set_async(e["r"], np.ones((4, 8), np.int32))),
    "set_async other device": (ValueError, lambda e: e["rb"].set_async(e["a"], e["x"])),
    "get_async non-contiguous": (ValueError, lambda e: e["rb"].get_async(e["r"], np.empty((8, 4), np.float32).T)),
    "set on unallocated tensor": (ValueError, lambda e: e["u"].set(e["x"])),
    "numpy of unallocated tensor": (ValueError, lambda e: e["u"].numpy()),
    "tensor of closed context": (gg.ClosedError, lambda e: e["z"].numpy()),
    "closed backend": (gg.ClosedError, lambda e: e["closed_be"].set(e["a"], e["x"])),
    "buffer over max size": (gg.OutOfMemory, lambda e: e["cpu"].buffer_type.alloc(e["cpu"].buffer_type.max_size + 1)),
    "negative buffer size": (ValueError, lambda e: e["cpu"].buffer_type.alloc(-1)),
    "clear value": (ValueError, lambda e: e["cpu"].buffer_type.alloc(8).clear(300)),
    "unaligned host buffer": (ValueError, lambda e: e["cpu"].buffer_from_host(np.zeros(65, np.uint8)[1:])),
    "wait on a backend without events": (gg.UnsupportedError, lambda e: e["be"].wait(e["rpc"].event())),
    "n_threads": (ValueError, lambda e: setattr(e["be"], "n_threads", 0)),
    "unknown type": (TypeError, lambda e: e["ctx"].tensor("f99", (4,))),
    "bad shape": (ValueError, lambda e: e["ctx"].tensor(gg.f32, (4, 0))),
    "too many axes": (ValueError, lambda e: e["ctx"].tensor(gg.f32, (1, 2, 3, 4, 5))),
}


# each case's message: the check that must refuse it (a different check raising instead fails)
MATCH = {
    "device name": "no device named 'GPU7'", "device index": "no device 42",
    "device key type": "name or an index", "device type": "unknown device type",
    "event on cpu": "CPU has no events", "copy size differs": "copy_async: shapes differ",
    "copy type differs": "copy_async: types differ", "copy unallocated": "source: tensor u has no memory",
    "copy wrong backend": "source tensor r lives on another device",
    "set out of bounds": "run past the tensor's 128 bytes", "set wrong dtype": "dtype float64 does not match",
    "set wrong size": "shape \\(4, 9\\) differs", "set non-contiguous": "not C-contiguous",
    "set not an array": "expected a numpy array", "get wrong size": "has 31 elements",
    "get read-only out": "output array is read-only", "set_async out of bounds": "set_async: .* run past",
    "set_async wrong dtype": "set_async: array dtype int32", "set_async other device": "lives on another device",
    "get_async non-contiguous": "get_async: .*not C-contiguous", "set on unallocated tensor": "set: tensor u has no memory",
    "numpy of unallocated tensor": "numpy\\(\\): tensor u has no memory",
    "tensor of closed context": "context is closed", "closed backend": "backend is closed",
    "buffer over max size": "exceed buffer type CPU's max size", "negative buffer size": "nbytes must be >= 0",
    "clear value": "must be a byte", "unaligned host buffer": "not aligned to",
    "wait on a backend without events": r"(CPU|RPC\S*) has no events", "n_threads": "n_threads must be an int in 1..",
    "unknown type": "not a ggml type: 'f99'", "bad shape": "every axis must be >= 1",
    "too many axes": "1 to 4 axes",
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_and_nothing_is_lost(env, case, rng):
    exc, fn = CASES[case]
    with pytest.raises(exc, match=MATCH[case]) as info:
        fn(env)

    assert isinstance(info.value, gg.GGMLError) or exc is LookupError
    assert str(info.value)
    # everything still works afterwards
    x = rng.standard_normal((4, 8)).astype(np.float32)
    env["a"].set(x)
    gg.copy_async(env["a"], env["b"], env["be"], env["be"])
    assert np.array_equal(env["b"].numpy(), x)
    env["rb"].set_async(env["r"], x)
    env["rb"].synchronize()
    assert np.array_equal(env["r"].numpy(), x)
