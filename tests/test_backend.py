"""Backends: creation, threads, sync and async set/get."""
import gc
import os
import weakref

import numpy as np

import ggml_py as gg


def test_backend_basics(dev):
    with dev.backend() as be:
        assert be.device is dev and be.name
        be.synchronize()
    assert be.closed


def test_cpu_threads_default_to_usable_cores(cpu):
    with cpu.backend() as be:
        assert be.n_threads == len(os.sched_getaffinity(0))
        be.n_threads = 1
        assert be.n_threads == 1
    with cpu.backend(n_threads=3) as be:
        assert be.n_threads == 3


def test_set_get_roundtrip(dev, rng):
    x = rng.standard_normal((8, 33)).astype(np.float32)
    with dev.backend() as be, gg.Context() as ctx:
        t = ctx.from_numpy(x)
        ctx.alloc(be)
        be.set(t, x)
        assert np.array_equal(be.get(t), x)
        out = np.empty_like(x)
        be.get(t, out)
        assert np.array_equal(out, x)


def test_async_roundtrip_keeps_the_array_alive(dev, rng):
    x = rng.standard_normal(1 << 16).astype(np.float32)
    expect = x.copy()
    with dev.backend() as be, gg.Context() as ctx:
        t = ctx.from_numpy(x)
        ctx.alloc(be)
        ref = weakref.ref(x)
        be.set_async(t, x)
        del x
        gc.collect()
        assert ref() is not None          # held by the backend until synchronize
        be.synchronize()
        gc.collect()
        assert ref() is None
        out = np.empty_like(expect)
        be.get_async(t, out)
        be.synchronize()
        assert np.array_equal(out, expect)


def test_partial_set_with_offset(cpu):
    with cpu.backend() as be, gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (8,))
        ctx.alloc(be)
        t.set(np.zeros(8, np.float32))
        t.set(np.ones(2, np.float32).view(np.uint8), offset=8, flat=True)
        assert t.numpy().tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
