"""Property-based shape fuzzing (hypothesis) of a core set of ops on the CPU backend: any
shapes the strategies draw, valid or not, either compute the numpy result or raise a
GGMLError; the process never aborts."""
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import ggml_py as gg
from support import nmse

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
dims = st.integers(1, 6)
shapes = st.lists(dims, min_size=1, max_size=4).map(tuple)


@pytest.fixture(scope="module")
def be():
    with gg.device("CPU").backend() as b:
        yield b


def _run(be, arrays, build):
    """build(*tensors) computed on `be`; None when ggml_py refused the shapes."""
    with gg.Context() as ctx:
        ts = [ctx.from_numpy(a) for a in arrays]
        ctx.alloc(be)
        for t, a in zip(ts, arrays):
            t.set(a)
        try:
            out = build(*ts)
        except gg.GGMLError:
            return None
        be.compute(gg.Graph(out))
        return out.numpy(copy=True)


def _arr(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _broadcasts(a, b):
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


@SETTINGS
@given(shapes, shapes, st.sampled_from(["add", "sub", "mul"]))
def test_binary_ops_broadcast_like_numpy(be, sa, sb, op):
    a, b = _arr(sa, 1), _arr(sb, 2)
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y}[op]
    got = _run(be, [a, b], fn)
    ref_ok = _broadcasts(sa, sb) and len(np.broadcast_shapes(sa, sb)) <= 4
    assert (got is not None) == ref_ok
    if got is not None:
        ref = fn(a, b)
        assert got.shape == ref.shape and nmse(got, ref) < 1e-7


@SETTINGS
@given(st.lists(dims, min_size=2, max_size=4).map(tuple), dims, st.booleans())
def test_matmul_like_numpy(be, sa, n, aligned):
    k = sa[-1] if aligned else sa[-1] + 1
    sb = sa[:-2] + (k, n)
    a, b = _arr(sa, 3), _arr(sb, 4)
    got = _run(be, [a, b], lambda x, y: x @ y)
    assert (got is not None) == aligned
    if aligned:
        assert nmse(got, a @ b) < 5e-4


def _blas_rows(t):
    return t.type.block_size > 1 or t.nb[1] >= t.ne[0] * t.type.type_size


@SETTINGS
@given(st.lists(st.integers(1, 3), min_size=3, max_size=3).map(tuple), dims,
       st.permutations([0, 1, 2]), st.booleans())
# one of the 10 in 162 draws whose view is contiguous by ggml's rule with a row stride shorter
# than its row (ne (2,1,1,1), nb (4,4,8,8)), named so that a run that draws none still tries it
@example(sa=(1, 1, 2), n=2, perm=[0, 2, 1], by_name=True)
@example(sa=(1, 1, 2), n=2, perm=[0, 2, 1], by_name=False)
def test_matmul_of_permuted_views_gives_blas_valid_operands(be, sa, n, perm, by_name):
    """Any permuted view (axes of length 1 included, whose strides ggml leaves arbitrary) fed
    to `@` computes numpy's answer, and every mul_mat/out_prod node of the graph has operands
    whose row stride is at least a row: CUDA passes it to cuBLAS as the leading dimension,
    which rejects a shorter one and ggml aborts (found on the H200). `gg.mul_mat` by name
    refuses such an operand instead."""
    a = _arr(sa, 5)
    b = _arr(sa[:-2] + (sa[-1], n), 6)
    stored = np.ascontiguousarray(np.transpose(a, np.argsort(perm)))
    with gg.Context() as ctx:
        raw = ctx.from_numpy(stored)
        tb = ctx.from_numpy(b)
        ctx.alloc(be)
        view = raw.permute(tuple(int(p) for p in np.argsort(np.argsort(perm))))
        assert view.shape == a.shape
        if by_name:
            other = ctx.from_numpy(np.ones((1, sa[-1]), np.float32))
            ctx.alloc(be)
            try:
                gg.mul_mat(other, view)
            except gg.InvalidArgument as e:
                assert not _blas_rows(view) or not view.is_contiguous or "stride" in str(e)
            else:
                assert _blas_rows(view)
            return
        out = view @ tb
        g = gg.Graph(out)
        for node in g.nodes:
            if node.op in ("MUL_MAT", "OUT_PROD"):
                assert all(_blas_rows(s) for s in node.src), node.op
        be.compute(g)
        assert nmse(out.numpy(copy=True), a @ b) < 5e-4


@SETTINGS
@given(shapes, st.data())
def test_permute_cont_and_reductions(be, shape, data):
    a = _arr(shape, 5)
    axes = tuple(data.draw(st.permutations(range(len(shape)))))
    got = _run(be, [a], lambda x: gg.cont(x.permute(axes)))
    assert np.array_equal(got, a.transpose(axes))
    assert nmse(_run(be, [a], gg.sum_rows), a.sum(-1, keepdims=True)) < 1e-7
    assert nmse(_run(be, [a], gg.soft_max), np.exp(a) / np.exp(a).sum(-1, keepdims=True)) < 1e-6
    rms = a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6)
    assert nmse(_run(be, [a], gg.rms_norm), rms) < 1e-7


@SETTINGS
@given(shapes, shapes, st.integers(-4, 4))
def test_concat_like_numpy(be, sa, sb, axis):
    a, b = _arr(sa, 6), _arr(sb, 7)
    try:
        ref = np.concatenate([a, b], axis)
    except (ValueError, np.exceptions.AxisError):
        ref = None
    got = _run(be, [a, b], lambda x, y: gg.concat(x, y, axis))
    assert (got is None) == (ref is None)
    if ref is not None:
        assert np.array_equal(got, ref)


@SETTINGS
@given(shapes, st.lists(dims, min_size=1, max_size=4).map(tuple))
def test_reshape_keeps_elements_or_raises(be, shape, new):
    a = _arr(shape, 8)
    got = _run(be, [a], lambda x: gg.cont(x.reshape(new)))
    assert (got is not None) == (a.size == int(np.prod(new)))
    if got is not None:
        assert np.array_equal(got, a.reshape(new))
