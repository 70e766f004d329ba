"""The ggml contexts that hold tensor records and graphs (ggml_py/_metadata.py): given back
when nothing can read them, kept for the next of their size up to Context.pool_limit, and
reused empty."""
import gc
import threading
import weakref

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import _metadata


@pytest.fixture
def pool():
    """A pool with room (restored after the test), emptied first."""
    old = gg.Context.pool_limit(0)
    gg.Context.pool_limit(64 << 20)
    yield
    gg.Context.pool_limit(old)


def _chain(ctx, n):
    x = ctx.tensor(gg.f32, (16,))
    t = x
    for _ in range(n):
        t = t + x
    return t


def _accounted():
    return sum(size * len(chunks) for size, chunks in _metadata._pool.items())


def test_a_context_of_many_chunks_is_given_back_when_dropped(pool):
    # its chunks are plain handles it frees itself: no cycle waits for the collector
    gc.disable()
    try:
        ctx = gg.Context(capacity=16)
        _chain(ctx, 100)
        assert int(repr(ctx)[len("<Context chunks="):-1]) >= 2
        before = _metadata.pooled()
        ref = weakref.ref(ctx)
        ctx.close()
        del ctx
        assert ref() is None
        assert _metadata.pooled() > before
    finally:
        gc.enable()


def test_freed_chunks_are_reused_empty_and_compute_right(pool, cpu):
    x = np.arange(16, dtype=np.float32)
    with gg.Context(capacity=64) as ctx:
        _chain(ctx, 200)                    # several chunks, full of records
    del ctx
    held = _metadata.pooled()
    assert held > 0 and held == _accounted()
    with cpu.backend() as be, gg.Context(capacity=64) as ctx:
        assert _metadata.pooled() < held        # its first chunk came from the pool
        assert ctx.n_tensors() == 0 and ctx.tensors == []
        a = ctx.from_numpy(x)
        out = a
        for _ in range(150):                   # across reused chunks
            out = out + a
        ctx.alloc(be)
        a.set(x)
        be.compute(gg.Graph(out))
        assert np.array_equal(out.numpy(copy=True), 151 * x)
        assert ctx.n_tensors() == len(ctx.tensors) == 151


def test_pool_limit_bounds_what_is_kept(pool):
    assert gg.Context.pool_limit(0) == 64 << 20
    assert _metadata.pooled() == 0
    with gg.Context(capacity=64) as ctx:
        _chain(ctx, 10)
    del ctx
    assert _metadata.pooled() == 0              # nothing kept with a limit of 0
    gg.Context.pool_limit(1 << 20)
    for _ in range(3):
        with gg.Context(capacity=64) as ctx:
            _chain(ctx, 500)
        del ctx
        assert 0 < _metadata.pooled() <= 1 << 20
    for bad, exc in ((-1, gg.InvalidArgument), (1.5, gg.InvalidType), (True, gg.InvalidType),
                     ("8", gg.InvalidType)):
        with pytest.raises(exc, match="pool_limit"):
            gg.Context.pool_limit(bad)
    assert gg.Context.pool_limit() == 1 << 20


def test_a_closed_graph_keeps_its_memory_until_collected(pool):
    # close() frees nothing a stale reference could read: the graph's chunk and the
    # context's go back only when the objects are collected
    ctx = gg.Context(capacity=32)
    g = gg.Graph(_chain(ctx, 40))
    assert g.n_nodes == 40
    before = _metadata.pooled()
    ctx.close()
    assert _metadata.pooled() == before
    with pytest.raises(gg.ClosedError):
        g.n_nodes
    with pytest.raises(gg.ClosedError):
        g.nodes
    del g, ctx
    gc.collect()
    assert _metadata.pooled() > before


def test_threads_building_and_dropping_contexts_keep_the_books(pool):
    errors = []

    def work(k):
        try:
            for i in range(60):
                with gg.Context(capacity=8 + (k * 7 + i) % 40) as ctx:
                    t = _chain(ctx, 30)
                    assert t.shape == (16,)
                    g = gg.Graph(t)
                    assert g.n_nodes == 30
                del ctx, t, g
        except BaseException as e:     # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    gc.collect()
    assert _metadata.pooled() == _accounted() <= 64 << 20
