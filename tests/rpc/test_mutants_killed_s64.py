"""Tests written against the survivors of the seed-64 mutation sample (docs/mutation.md,
round 7): each fails when its mutant (tools/must_kill.txt) is applied and passes without."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import opt
from support import ROOT, child_env
from support.meta_models import meta_supported, run


def test_a_tensor_name_must_be_a_str():
    with gg.Context() as ctx:
        for bad in (5, b"w", ["w"]):
            with pytest.raises(gg.InvalidType, match="name must be a str, not"):
                ctx.tensor(gg.f32, (4,), name=bad)
        assert ctx.tensor(gg.f32, (4,), name="w").name == "w"


def test_buffer_from_host_takes_a_numpy_array(cpu):
    for bad in ([1.0, 2.0], memoryview(bytearray(64)), b"\0" * 64):
        with pytest.raises(gg.InvalidType, match="expected a numpy array, not"):
            cpu.buffer_from_host(bad)


def test_the_optimizer_trains_f32_parameters_only(cpu):
    with cpu.backend() as be, gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (8, 4), "x")
        w = ctx.tensor(gg.f16, (3, 4), "w")
        ctx.alloc(be)
        w.set(np.ones((3, 4), np.float16))
        with pytest.raises(gg.InvalidArgument, match="parameter w is f16; only f32"):
            opt.Optimizer(be, x, gg.mul_mat(w, x), [w])


def test_a_graph_on_a_dead_rpc_server_closes_and_the_process_survives():
    """Graph.prepare's allocator for an RPC backend's nodes frees its remote buffer only while
    the server answers (ggml's client aborts on a dead one). In a fresh process."""
    code = textwrap.dedent("""
        import numpy as np
        import ggml_py as gg
        srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
        be = dev.backend()
        ctx = gg.Context()
        x = ctx.from_numpy(np.arange(16, dtype=np.float32), "x")
        ctx.alloc(be)
        x.set(np.arange(16, dtype=np.float32))
        y = gg.relu(x * 2.0) + x            # nodes the graph's allocator places on the server
        g = gg.Graph(y)
        be.compute(g)
        print("computed", float(y.numpy().sum()))
        srv.kill()
        del g, y                            # the graph and its allocator go
        import gc; gc.collect()
        ctx.close()
        be.close()
        print("survived")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=child_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["computed 360.0", "survived"], r.stdout


def test_the_python_pass_of_prepare_computes_on_an_rpc_backend(rpc_devs):
    """Graph.prepare's pass in Python (the bindings without helpers.c, rewired graphs) asks
    both the RPC device and the local CPU whether each node can run: an op both support
    computes."""
    import ggml_py._graph as G
    xs = np.arange(24, dtype=np.float32).reshape(6, 4) - 10
    saved = G._PREPARE
    G._PREPARE = None
    try:
        with rpc_devs[0].backend() as be, gg.Context() as ctx:
            x = ctx.from_numpy(xs, "x")
            ctx.alloc(be)
            x.set(xs)
            y = gg.relu(x * 0.5) + x
            be.compute(gg.Graph(y))
            np.testing.assert_array_equal(y.numpy(), np.maximum(xs * 0.5, 0) + xs)
    finally:
        G._PREPARE = saved


@pytest.mark.skipif(not meta_supported(), reason="ggml_py offers meta devices from ggml 0.26.0")
def test_a_contiguous_view_of_a_split_result_on_a_meta_device(rpc_servers, rng):
    """A flat view of a column-parallel matmul's output (both contiguous) is planned as a
    reshape: a segmented split, which ggml's meta backend computes."""
    parts = [s.device for s in rpc_servers]
    w = {"w": rng.standard_normal((6, 8)).astype(np.float32),
         "x": rng.standard_normal((4, 8)).astype(np.float32)}
    md = gg.meta_device(parts, {"w": gg.Split(axis=0)})
    with md.backend() as be:
        got = run(be, w, lambda t: gg.view(gg.mul_mat(t["w"], t["x"]), (24,), 0))
    np.testing.assert_allclose(got, (w["x"] @ w["w"].T).reshape(-1), rtol=1e-5, atol=1e-5)


def test_out_prod_refuses_a_row_stride_shorter_than_a_row():
    """A one-row view may keep a row stride shorter than its row (ggml_is_contiguous ignores
    axes of length 1): the CPU kernel never reads it, cuBLAS rejects it as lda and ggml aborts
    (CUDA). The rule holds on every backend, so a program that runs here runs there."""
    with gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (8,))
        b = ctx.tensor(gg.f32, (1, 3))
        v = gg.view(t, (1, 8), 0, (4, 4))
        assert v.nb[1] == 4 < 8 * 4
        with pytest.raises(gg.InvalidArgument, match=r"a \(1, 8\) has a row stride of 4 bytes"):
            gg.out_prod(v, b)
        assert gg.out_prod(gg.cont(v), b).shape == (3, 8)


def test_repeat_refuses_fewer_axes_than_its_operand():
    """(1, 3) to (6,) tiles in ggml's four axes, but numpy refuses to drop an axis: so does
    repeat, rather than return a 1-D result of a 2-D operand."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (1, 3))
        with pytest.raises(gg.InvalidArgument, match=r"\(6,\) has fewer axes than \(1, 3\)"):
            gg.repeat(a, (6,))
        assert gg.repeat(a, (2, 6)).shape == (2, 6)


def test_an_op_of_a_later_release_is_refused_with_the_release_that_added_it():
    """ops._common.need is the one rule for ops that only later releases have (scale_bias,
    fill, cumsum, top_k, pad_ext): with this build's release in the message."""
    from ggml_py import BUILD
    from ggml_py.ops import _common
    with pytest.raises(gg.UnsupportedError,
                       match=rf"frob is not in this ggml release \({BUILD['release']}\): "
                             r"ggml_frob arrived in ggml a later release"):
        _common.need("ggml_frob", "frob")
    assert _common.need("ggml_add", "add") is not None
