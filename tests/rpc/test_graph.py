"""Graphs: computing synchronously and asynchronously, nodes and leafs, pictures, and what
a graph does when one of its contexts closed."""
import numpy as np
import pytest

import ggml_py as gg

X = np.random.default_rng(7).standard_normal((3, 4, 16)).astype(np.float32)


def test_compute_async_then_synchronize(dev):
    with dev.backend() as be, gg.Context() as ctx:
        a = ctx.from_numpy(X)
        ctx.alloc(be)
        a.set(X)
        out = gg.relu(a)
        be.compute_async(gg.Graph(out))
        be.synchronize()
        assert np.array_equal(out.numpy(copy=True), np.maximum(X, 0))


def test_graph_nodes_leafs_and_dot(cpu):
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 4), "a")
        out = gg.relu(a + a)
        g = gg.Graph(out)
        assert g.n_nodes == 2 and [t.name for t in g.leafs] == ["a"]
        assert "digraph" in g.to_dot()
        svg = g.to_svg()
        assert svg.startswith("<svg") and svg.count("<rect") >= g.n_nodes + len(g.leafs)
        assert "RELU" in svg and ">a<" in svg



# -- Graph.prepare: the C helper and the Python pass agree --------------------------------------
_STEPS = ("add x", "mul r", "relu", "add u", "view of x", "get_rows", "set_rows", "scale")


def _prepare_outcome(rpc_dev, steps, in_c):
    """Build the graph `steps` describe (operands: x on the CPU, r in an RPC buffer the CPU
    backend cannot use, u in a context never allocated), compute it on the CPU and say what
    happened: the result, or the exception and its message."""
    import ggml_py._graph as G
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((6, 4)).astype(np.float32)
    saved = G._PREPARE
    if not in_c:
        G._PREPARE = None
    try:
        with gg.device("CPU").backend() as be, rpc_dev.backend() as rb, \
                gg.Context() as ca, gg.Context() as cr, gg.Context() as cu:
            x = ca.from_numpy(xs, "x")
            dsts = [ca.from_numpy(xs, f"dst{i}") for i in range(len(steps))]   # (set_rows
            # writes in place: a destination of its own per step, never the rows it reads)
            order = np.array([5, 0, 2, 1, 4, 3], np.int32)
            idx = ca.from_numpy(order, "idx")
            r = cr.from_numpy(xs, "r")
            u = cu.tensor(gg.f32, (6, 4), "u")
            ca.alloc(be)
            cr.alloc(rb)
            for t, v in ((x, xs), (idx, order), (r, xs), *((d, xs) for d in dsts)):
                t.set(v)
            t = x
            for i, s in enumerate(steps):
                if s == "add x":
                    t = t + x
                elif s == "mul r":
                    t = t * r
                elif s == "relu":
                    t = gg.relu(t)
                elif s == "add u":
                    t = t + u
                elif s == "view of x":          # a view made after x was allocated
                    t = t + x.view((6, 4))
                elif s == "get_rows":
                    t = gg.get_rows(t, idx)
                elif s == "set_rows":
                    t = gg.set_rows(dsts[i], t, idx)
                elif s == "scale":
                    t = t * 0.5
            g = gg.Graph(t)
            be.compute(g)
            return ("ok", t.numpy(copy=True).tobytes(), [(str(op), n) for _, n, op in g._indices()])
    except gg.GGMLError as e:
        return (type(e).__name__, str(e))
    finally:
        G._PREPARE = saved


def test_prepare_in_c_and_in_python_agree(rpc_devs):
    """Graph.prepare checks a graph in one C call (ggml_build/helpers.c) where the bindings
    have it, in Python elsewhere: generated graphs mixing inputs without memory, buffers the
    backend cannot use, views made after allocation and index ops give the same result or the
    same error both ways."""
    import ggml_py._graph as G
    from hypothesis import HealthCheck, given, settings, strategies as st
    if G._PREPARE is None:
        pytest.skip("these bindings have no C helper (ABI mode, or built before it existed)")

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.sampled_from(_STEPS), min_size=1, max_size=6))
    def check(steps):
        assert _prepare_outcome(rpc_devs[0], steps, True) == \
            _prepare_outcome(rpc_devs[0], steps, False), steps

    check()
