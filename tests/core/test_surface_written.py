"""Reading values no one wrote raises (issue 32, item 3): a set, a load, a copy or a compute
writes a tensor; its memory placed again forgets it; t.raw_numpy() reads raw memory on purpose."""
import numpy as np
import pytest

import ggml_py as gg


@pytest.fixture
def be():
    with gg.device("CPU").backend() as b:
        yield b


def test_allocated_but_never_set_raises(be):
    ctx = gg.Context()
    t = ctx.tensor(gg.f32, (4,), "t")
    ctx.alloc(be)
    with pytest.raises(gg.UnwrittenError, match="tensor t holds no values"):
        t.numpy()
    with pytest.raises(gg.UnwrittenError):
        be.get(t)
    with pytest.raises(gg.UnwrittenError):
        np.asarray(t)
    assert t.raw_numpy().shape == (4,)           # on purpose, by name
    t.set(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(t.numpy(), np.arange(4))


def test_a_node_reads_once_its_graph_computed(be):
    ctx = gg.Context()
    a = ctx.from_numpy(np.ones(4, np.float32))     # from_numpy's values: set at alloc
    ctx.alloc(be)
    np.testing.assert_array_equal(a.numpy(), 1)
    y = gg.cont(a * 3)
    g = gg.Graph(y)
    g2 = gg.Graph(y * 2)                           # placed by its own compute, never run
    with pytest.raises((gg.UnwrittenError, gg.InvalidArgument)):
        y.numpy()
    be.compute(g)
    np.testing.assert_array_equal(y.numpy(), 3)
    np.testing.assert_array_equal(y.reshape((2, 2)).numpy(), 3)   # a view of written memory
    del g2


def test_copies_and_async_writes_count(be):
    ctx = gg.Context()
    a = ctx.from_numpy(np.arange(4, dtype=np.float32))
    b, c = ctx.tensor(gg.f32, (4,)), ctx.tensor(gg.f32, (4,))
    ctx.alloc(be)
    gg.copy(a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(4))
    be.set_async(c, np.full(4, 2, np.float32))
    be.synchronize()
    np.testing.assert_array_equal(c.numpy(), 2)


def test_memory_placed_again_reads_as_unwritten(be):
    ctx = gg.Context()
    t = ctx.from_numpy(np.ones(4, np.float32))
    (buf,) = ctx.alloc(be)
    t.numpy()
    buf.close()                                     # the memory is gone
    ctx.alloc(be)                                   # placed again: nothing wrote it since
    with pytest.raises(gg.UnwrittenError):
        t.numpy()


def test_scheduler_nodes_read_after_compute(be):
    ctx = gg.Context()
    x = ctx.from_numpy(np.arange(4, dtype=np.float32))
    ctx.alloc(be)
    y = gg.exp(x)
    with gg.Scheduler([be]) as sched:
        sched.compute(gg.Graph(y))
        np.testing.assert_allclose(y.numpy(), np.exp(np.arange(4)), rtol=1e-6)


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("op", ["cpy", "set_rows"])
def test_the_target_an_op_writes_into_reads_once_computed(be, op, asynchronous):
    """cpy and set_rows return a view of their destination: computing them writes the
    destination, which was never set, so it must read afterwards (a Vulkan CI run raised
    UnwrittenError on a cpy's destination)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ctx = gg.Context()
    a = ctx.from_numpy(x)
    dst = ctx.tensor(gg.f32, x.shape, "dst")
    idx = ctx.from_numpy(np.array([1, 0], np.int64)) if op == "set_rows" else None
    ctx.alloc(be)
    with pytest.raises(gg.UnwrittenError):
        dst.numpy()
    node = gg.cpy(a * 2, dst) if op == "cpy" else gg.set_rows(dst, a * 2, idx)
    g = gg.Graph(node)
    if asynchronous:
        be.compute_async(g)
        be.synchronize()
    else:
        be.compute(g)
    want = 2 * x if op == "cpy" else 2 * x[[1, 0]]
    np.testing.assert_array_equal(dst.numpy(), want)


@pytest.mark.parametrize("layout", ["reshape", "view", "permute", "transpose"])
def test_a_layout_node_does_not_write_what_it_views(be, layout):
    """Computing a graph whose node is only a reshape/view/permute/transpose of a tensor no one
    wrote writes nothing: both still raise (they read the raw buffer otherwise)."""
    ctx = gg.Context()
    t = ctx.tensor(gg.f32, (2, 3), "t")
    ctx.alloc(be)
    node = {"reshape": lambda: t.reshape((3, 2)), "view": lambda: gg.view(t, (3,)),
            "permute": lambda: gg.permute(t, (1, 0)), "transpose": lambda: gg.transpose(t)}[layout]()
    try:
        be.compute(gg.Graph(node))
    except gg.GGMLError:
        pytest.skip(f"a graph of one {layout} node is refused here")
    with pytest.raises(gg.UnwrittenError):
        t.numpy()
    with pytest.raises(gg.UnwrittenError):
        node.numpy()
    t.set(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert node.numpy().size == (3 if layout == "view" else 6)   # its source holds values now
