"""The ggml contexts that hold tensor records and graphs (ggml_py/_record_pool.py): given back
when nothing can read them, kept for the next of their size up to Context.pool_limit, and
reused empty."""
import gc
import threading
import weakref

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import _record_pool


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
    return sum(size * len(chunks) for size, chunks in _record_pool._pool.items())


def test_a_context_of_many_chunks_is_given_back_when_dropped(pool):
    # its chunks are plain handles it frees itself: no cycle waits for the collector
    gc.disable()
    try:
        ctx = gg.Context(capacity=16)
        _chain(ctx, 100)
        assert int(repr(ctx)[len("<Context chunks="):-1]) >= 2
        before = _record_pool.pooled()
        ref = weakref.ref(ctx)
        ctx.close()
        del ctx
        assert ref() is None
        assert _record_pool.pooled() > before
    finally:
        gc.enable()


def test_freed_chunks_are_reused_empty_and_compute_right(pool, cpu):
    x = np.arange(16, dtype=np.float32)
    with gg.Context(capacity=64) as ctx:
        _chain(ctx, 200)                    # several chunks, full of records
    del ctx
    held = _record_pool.pooled()
    assert held > 0 and held == _accounted()
    with cpu.backend() as be, gg.Context(capacity=64) as ctx:
        assert _record_pool.pooled() < held        # its first chunk came from the pool
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
    assert _record_pool.pooled() == 0
    with gg.Context(capacity=64) as ctx:
        _chain(ctx, 10)
    del ctx
    assert _record_pool.pooled() == 0              # nothing kept with a limit of 0
    gg.Context.pool_limit(1 << 20)
    for _ in range(3):
        with gg.Context(capacity=64) as ctx:
            _chain(ctx, 500)
        del ctx
        assert 0 < _record_pool.pooled() <= 1 << 20
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
    before = _record_pool.pooled()
    ctx.close()
    assert _record_pool.pooled() == before
    with pytest.raises(gg.ClosedError):
        g.n_nodes
    with pytest.raises(gg.ClosedError):
        g.nodes
    del g, ctx
    gc.collect()
    assert _record_pool.pooled() > before


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
    assert _record_pool.pooled() == _accounted() <= 64 << 20


RETRIED = r"""
import gc, sys, numpy as np, ggml_py as gg
from ggml_py import _record_pool
gg.Context.pool_limit(int(sys.argv[1]))
be = gg.device("CPU").backend()
ctx = gg.Context(capacity=16)
a = ctx.from_numpy(np.ones(4, np.float32))
bufs = ctx.alloc(be)
bufs[0].on_close(lambda: 1 / 0)
for _ in range(3):
    try:
        ctx.close()
    except ZeroDivisionError:
        pass
del a, bufs, ctx
gc.collect()                      # (a second release: a double free without the pool)
assert all(len(set(int(gg.ffi.cast("uintptr_t", r)) for r in chunks)) == len(chunks)
           for chunks in _record_pool._pool.values())
c1, c2 = gg.Context(capacity=16), gg.Context(capacity=16)
x = c1.tensor(gg.f32, (4,), "x")
y = c2.tensor(gg.f32, (8,), "y")
assert [t.name for t in c1.tensors] == ["x"] and [t.name for t in c2.tensors] == ["y"]
print("ok")
"""


@pytest.mark.parametrize("limit", [64 << 20, 0])
def test_a_close_retried_after_a_failure_gives_the_chunks_back_once(limit):
    # a buffer's on_close callback raising makes close() fail half way; the retries (a `with`
    # exiting, the user again) must give the chunks back once: twice, two live contexts are
    # handed one chunk (pooled), or it is freed twice (no pool). A child process: a double
    # free aborts
    import subprocess
    import sys
    from support import child_env
    r = subprocess.run([sys.executable, "-c", RETRIED, str(limit)], capture_output=True,
                       text=True, timeout=120, env=child_env())
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
