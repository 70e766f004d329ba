"""The one lifetime mechanism (docs/ownership.md): close() runs the on_close steps in order,
then closes the children, then frees, or leaves the free to the live exports of the memory;
after_free steps come last. Checked on bare owners with a Python free, then on real ones."""
import gc
import threading
import weakref

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import _handle
from ggml_py._handle import Export, Owned


def _owner(log, name, **kw):
    return Owned(name, lambda raw: log.append(f"free {raw}"), **kw)


def test_close_runs_steps_in_order_then_children_then_free_then_after_free():
    log = []
    parent = _owner(log, "parent")
    child = _owner(log, "child", parents=(parent,))
    parent.on_close(lambda: log.append("after 1"), after_free=True)
    parent.on_close(lambda: log.append("step 1"))
    parent.on_close(lambda: log.append("step 2"))
    child.on_close(lambda: log.append("child step"))
    parent.close()
    assert log == ["step 1", "step 2", "child step", "free child", "free parent", "after 1"]
    parent.close()                               # idempotent: nothing runs twice
    assert len(log) == 6 and parent.closed and child.closed


def test_a_step_that_raises_leaves_the_object_open_and_close_can_be_retried():
    log, fail = [], [True]

    def step():
        if fail[0]:
            raise ZeroDivisionError
        log.append("step")

    o = _owner(log, "o")
    o.on_close(step)
    with pytest.raises(ZeroDivisionError):
        o.close()
    assert not o.closed and log == []
    fail[0] = False
    o.close()
    assert o.closed and log == ["step", "free o"]


def test_a_close_reached_again_from_its_own_steps_returns():
    log = []
    o = _owner(log, "o")
    o.on_close(o.close)                          # (the optimizer/scheduler pattern)
    o.on_close(lambda: log.append("step"))
    o.close()
    assert log == ["step", "free o"]


def test_an_export_keeps_the_memory_of_an_owner_closed_under_it():
    log = []
    a, b = _owner(log, "a"), _owner(log, "b")
    e1, e2 = Export([a, b]), Export([a])
    a.close()
    b.close()
    assert a.closed and b.closed and log == []   # closed, their memory left to the exports
    del e1
    gc.collect()
    assert log == ["free b"]                     # b's only export is gone; a has e2 still
    del e2
    gc.collect()
    assert log == ["free b", "free a"]


def test_an_export_holds_its_owners_and_ignores_closed_ones():
    log = []
    a, gone = _owner(log, "a"), _owner(log, "gone")
    gone.close()
    e = Export([a, gone, "not an owner"])
    r = weakref.ref(a)
    del a
    gc.collect()
    assert r() is not None and log == ["free gone"]   # collection cannot free under it
    del e
    gc.collect()
    assert r() is None and log == ["free gone", "free a"]


def test_an_owner_with_steps_of_its_own_dies_without_the_cyclic_collector():
    # a bound method of the object given to on_close is held weakly: a strong one would
    # make every Backend, Scheduler, Event... a cycle, freed only by a cyclic collection
    be = gg.device("CPU").backend(1)
    ctx = gg.Context()
    sched = gg.Scheduler([be])
    refs = [weakref.ref(o) for o in (be, ctx, sched)]
    gc.disable()
    try:
        del be, ctx, sched
        assert [r() for r in refs] == [None, None, None]
    finally:
        gc.enable()


def test_close_takes_a_buffer_s_context_lock_first():
    # a thread holding the context's lock (setting, computing) keeps the buffer's memory, and
    # the buffer's close waits for it before taking the buffer's own lock: the order a
    # context's close takes them (context, then its buffers), so the two never wait on each
    # other
    be = gg.device("CPU").backend(1)
    ctx = gg.Context()
    ctx.tensor(gg.f32, (4,))
    [buf] = ctx.alloc(be)
    ctx._lock.acquire()
    try:
        closer = threading.Thread(target=buf.close)
        closer.start()
        closer.join(0.3)
        assert closer.is_alive() and not buf.closed       # waits for the context's user
        free = buf._lock.acquire(timeout=1)
        assert free, "the closing buffer holds its own lock while it waits for its context's"
        buf._lock.release()
    finally:
        ctx._lock.release()
    closer.join()
    assert buf.closed


def test_a_numpy_view_keeps_the_memory_of_a_scheduler_closed_under_it(monkeypatch):
    freed = []

    def release(free, raw, what, guard=None):
        freed.append(what)
        free(raw)

    monkeypatch.setattr(_handle, "_release", release)     # (read as each owner is made)
    be = gg.device("CPU").backend(1)
    ctx = gg.Context()
    a = ctx.from_numpy(np.arange(8, dtype=np.float32))
    a.set_input()
    y = a * a
    sched = gg.Scheduler([be])
    g = gg.Graph(y)
    sched.alloc(g)
    a.set(np.arange(8, dtype=np.float32))
    sched.compute(g)
    v = y.numpy()
    sched.close()
    assert sched.closed and "scheduler" not in freed       # left to the view
    assert (v == np.arange(8) ** 2).all()
    del v
    gc.collect()
    assert "scheduler" in freed
