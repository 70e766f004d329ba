"""Tensors and contexts: data in and out, quantized values, growing contexts, numpy-semantics
operators with Python scalars, lifetimes across contexts, copies refused."""
import numpy as np
import pytest

import ggml_py as gg
from support import nmse


def test_quantized_roundtrip(cpu):
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    with cpu.backend() as be, gg.Context() as ctx:
        q = ctx.tensor(gg.q8_0, x.shape)
        ctx.alloc(be)
        q.set(x)                      # quantized on the way in with ggml_quantize_chunk
        assert nmse(q.numpy(), x) < 1e-3
        raw, t = gg.quantize(x, gg.q4_0)
        assert t is gg.q4_0 and raw.nbytes == 4 * gg.q4_0.row_size(64)


def test_a_null_tensor_is_refused():
    with gg.Context() as ctx:
        with pytest.raises(gg.InvalidArgument, match="NULL"):
            ctx.wrap(gg.ffi.NULL)
        with pytest.raises(gg.InvalidArgument, match="NULL"):
            ctx.wrap_raw(gg.ffi.NULL)


def test_context_grows_past_its_capacity(cpu):
    with cpu.backend() as be, gg.Context(capacity=16) as ctx:
        a = ctx.from_numpy(np.ones(8, np.float32))
        ctx.alloc(be)
        a.set(np.ones(8, np.float32))
        t = a
        for _ in range(100):
            t = t + a
        be.compute(gg.Graph(t))
        assert t.numpy()[0] == 101



@pytest.fixture
def be(cpu):
    with cpu.backend() as b:
        yield b


def _alloc(be, *arrays):
    ctx = gg.Context()
    ts = [ctx.from_numpy(a) for a in arrays]
    ctx.alloc(be)                      # sets the values given to from_numpy
    return ctx, ts


X = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32) + 2.0
R = np.random.default_rng(4).standard_normal((4,)).astype(np.float32) + 2.0

SCALAR_CASES = {
    "a + 1.5": (lambda a: a + 1.5, X + 1.5),
    "1.5 + a": (lambda a: 1.5 + a, 1.5 + X),
    "a - 2": (lambda a: a - 2, X - 2),
    "2 - a": (lambda a: 2 - a, 2 - X),
    "a * 3": (lambda a: a * 3, X * 3),
    "3 * a": (lambda a: 3 * a, 3 * X),
    "a / 4": (lambda a: a / 4, X / 4),
    "4 / a": (lambda a: 4 / a, 4 / X),
    "np scalar": (lambda a: a * np.float32(0.5) + np.int64(1), X * 0.5 + 1),
    "-a": (lambda a: -a, -X),
    "abs(a)": (lambda a: abs(a), np.abs(X)),
    "a.T + 1 (strided)": (lambda a: a.T + 1.0, X.T + 1.0),
    "a.T * a.T": (lambda a: a.T * a.T, X.T * X.T),
    "a.T.reshape": (lambda a: a.T.reshape(12), X.T.reshape(12)),
}


@pytest.mark.parametrize("case", list(SCALAR_CASES))
def test_operators_take_python_scalars_and_any_layout(be, case):
    fn, ref = SCALAR_CASES[case]
    ctx, (a,) = _alloc(be, X)
    if case == "4 / a" and not hasattr(gg.lib, "ggml_fill"):     # refused, saying why
        with pytest.raises(gg.UnsupportedError, match=r"arrived in ggml 0\.10\.1"):
            fn(a)
        ctx.close()
        pytest.skip("a scalar over a tensor needs ggml_fill, which arrived in ggml 0.10.1 "
                    f"(this build is {gg.ggml_version()})")
    out = fn(a)
    be.compute(gg.Graph(out))
    assert nmse(out.numpy(copy=True), ref) < 1e-7
    ctx.close()


def test_broadcast_with_the_smaller_operand_first(be):
    ctx, (a, r) = _alloc(be, X, R)
    for out, ref in ((r + a, R + X), (r - a, R - X), (r * a, R * X), (r / a, R / X)):
        be.compute(gg.Graph(out))
        assert nmse(out.numpy(copy=True), ref) < 1e-7
    ctx.close()


def test_from_numpy_values_are_set_by_alloc(be):
    """The docstring's promise: the values given to from_numpy are there after ctx.alloc."""
    ctx = gg.Context()
    a = ctx.from_numpy(X)
    X_changed = X.copy()
    ctx.alloc(be)
    X_changed[:] = 0                                  # a copy was taken at from_numpy
    assert np.array_equal(a.numpy(), X)
    ctx.close()


def test_a_result_keeps_the_context_that_holds_it():
    """An op's result lives in the context of the operand that owns it and keeps that
    context; closing the other operand's context cannot leave it pointing into freed memory
    (a two-context a @ b, then closing a's context, then c.op used to segfault)."""
    ca, cb = gg.Context(), gg.Context()
    a = ca.tensor(gg.f32, (4, 8))
    b = cb.tensor(gg.f32, (8, 4))
    c = a @ b
    d = gg.cpy(a, cb.tensor(gg.f32, (4, 8)))         # cpy's result belongs to the destination
    assert d.ctx is cb
    owner = c.ctx
    assert owner.owns(c.ptr)
    other = ca if owner is cb else cb
    other.close()
    assert c.op == "MUL_MAT"                          # its own context is open: fine
    with pytest.raises(gg.ClosedError, match="operand is closed"):
        c.src                                         # the closed context's tensor raises
    owner.close()
    with pytest.raises(gg.ClosedError, match="context is closed"):
        c.op
    ca.close(); cb.close()


def test_copies_and_pickles_are_refused(be, cpu):
    import copy
    import pickle
    ctx, (a,) = _alloc(be, X)
    for obj in (a, ctx, be, ctx.alloc(be) or cpu.buffer_type.alloc(16), gg.Graph(a + a)):
        with pytest.raises(TypeError, match="cannot be (copied|pickled)"):
            copy.copy(obj)
        with pytest.raises(TypeError, match="cannot be (copied|pickled)"):
            copy.deepcopy(obj)
        with pytest.raises(TypeError, match="cannot be pickled|cannot be copied"):
            pickle.dumps(obj)
    assert copy.copy(cpu) is cpu                       # devices belong to ggml: the same one
    ctx.close()


def test_closing_a_buffer_under_its_tensors_makes_them_unallocated(be):
    ctx, (a,) = _alloc(be, X)
    out = a + a
    g = gg.Graph(out)
    ctx._buffers[0].close()
    with pytest.raises(gg.InvalidArgument, match="has no memory"):
        a.numpy()
    with pytest.raises(gg.InvalidArgument, match="has no memory"):
        be.compute(gg.Graph(a * 2.0))
    ctx.close()
    del g


def test_help_shows_real_signatures():
    import inspect
    assert str(inspect.signature(gg.mul_mat)) == "(a: 'Tensor', b: 'Tensor') -> 'Tensor'"
    assert "eps" in str(inspect.signature(gg.norm))
    assert inspect.signature(gg.relu).parameters["a"]


def test_package_face_is_tidy():
    names = dir(gg)
    for private in ("annotations", "cstr", "registry", "tensor", "ops_old"):
        assert private not in names
    for public in ("Tensor", "Context", "mul_mat", "f32", "__version__", "raw" if False else "ops"):
        assert public in names
    assert set(gg.__all__) <= set(names) | {"rpc", "gguf", "dlpack", "from_dlpack"}
    from ggml_py.raw import ffi, lib
    assert lib is gg.lib and ffi is gg.ffi
    assert isinstance(gg.devices(), list) and hasattr(gg.devices(), "_repr_html_")


def test_zero_copy_exports_outlive_an_explicit_close(be):
    """numpy(copy=False) views and DLPack exports keep the memory they show: closing the
    context hands the memory to them instead of freeing it under them."""
    import gc
    import weakref
    ctx, (a,) = _alloc(be, X)
    out = a * 2.0
    be.compute(gg.Graph(out))
    view = a.numpy()                              # zero-copy over the context's buffer
    result = out.numpy()                          # zero-copy over the graph allocator's memory
    exported = np.from_dlpack(a)
    buf_ref = weakref.ref(ctx._buffers[0])
    ctx.close()
    with pytest.raises(gg.ClosedError, match="context is closed"):
        a.numpy()
    junk = [np.ones(1 << 16, np.float32) for _ in range(8)]   # reuse freed memory, if any
    assert np.array_equal(view, X) and np.array_equal(exported, X)
    assert np.array_equal(result, X * 2)
    del view, result, exported, junk
    gc.collect()
    assert buf_ref() is None                      # freed once the last export went
