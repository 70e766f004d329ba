"""Graphs: computing synchronously and asynchronously, nodes and leafs, pictures, and what
a graph does when one of its contexts closed."""
import numpy as np

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

