"""Tests written against the survivors of the census of every mutant (docs/mutation.md, round
8): each fails when its mutant (tools/must_kill.txt) is applied and passes without."""
import numpy as np
import pytest

import ggml_py as gg
from ggml_py import opt
from support.meta_models import meta_supported


@pytest.mark.parametrize("bad", ["127.0.0.1 :50052", "h\u00e9te:50052", "a\x00b:50052",
                                 "a\tb:50052", "a\nb:50052"])
def test_an_endpoint_is_printable_ascii_without_spaces(bad):
    """ggml's RPC client and server take the endpoint as a C string: a NUL would cut it, a
    space or a non-ASCII host reaches the resolver. Refused before any socket, by name."""
    for fn in (gg.rpc.parse_endpoint, gg.rpc.connect):
        with pytest.raises(gg.InvalidArgument, match="must be printable ASCII without spaces"):
            fn(bad)


def test_gradients_name_each_bad_argument(small_model):
    be, ctx, x, W = small_model
    loss = gg.sum(gg.mul_mat(W, x))
    for backend in ("CPU", None, gg.device("CPU")):
        with pytest.raises(gg.InvalidArgument, match="backend must be a Backend"):
            opt.gradients(loss, [W], backend)
    for params in ([], [np.ones((3, 2), np.float32)], [W, "W"]):
        with pytest.raises(gg.InvalidArgument, match="params must be a non-empty list of Tensors"):
            opt.gradients(loss, params, be)
    ints = ctx.tensor(gg.i32, (3, 2), "ints")
    with pytest.raises(gg.InvalidArgument, match="parameter ints must be f32 or f16 and have "
                                                 "memory"):
        opt.gradients(gg.sum(gg.mul_mat(W, x)), [ints], be)
    with gg.Context() as bare:
        V = bare.tensor(gg.f32, (3, 2), "V")        # never allocated
        with pytest.raises(gg.InvalidArgument, match="parameter V must be f32 or f16 and have "
                                                     "memory"):
            opt.gradients(gg.sum(gg.mul_mat(V, x)), [V], be)


def test_an_optimizer_refuses_a_model_beyond_ggml_opts_graphs(small_model):
    """ggml-opt's graphs have GGML_DEFAULT_GRAPH_SIZE slots for the forward pass, its gradients
    and the optimizer steps: a chain of 600 adds needs more, and is refused before
    ggml_opt_init (which would overflow the graph and abort)."""
    be, ctx, x, W = small_model
    b = ctx.tensor(gg.f32, (3,), "b")
    ctx.alloc(be)
    y = gg.mul_mat(W, x)
    for _ in range(600):
        y = y + b
    with pytest.raises(gg.InvalidArgument, match="ggml-opt's graphs hold 2048 slots"):
        opt.Optimizer(be, x, y, [W, b])


def test_optimizer_settings_and_epochs_refuse_bad_values(small_model):
    be, ctx, x, W = small_model
    trainer = opt.Optimizer(be, x, gg.mul_mat(W, x), [W], loss="mse")
    try:
        for eps in (-1e-8, -1, "1e-8"):
            with pytest.raises(gg.InvalidArgument, match="eps must be >= 0"):
                trainer.set_hyperparameters(eps=eps)
        for wd in (-0.1, 1.5, "0.1"):
            with pytest.raises(gg.InvalidArgument, match=r"weight_decay must be in \[0, 1\]"):
                trainer.set_hyperparameters(weight_decay=wd)
        trainer.set_hyperparameters(eps=0, weight_decay=1)        # the bounds themselves
        X = np.ones((16, 2), np.float32)
        for bad in (X, [X], None):
            with pytest.raises(gg.InvalidArgument, match="expected an opt.Dataset"):
                trainer.epoch(bad)
        # one batch of 16 with a quarter kept for validation leaves no whole batch to train on
        with opt.Dataset(X, np.ones((16, 3), np.float32)) as one_batch:
            with pytest.raises(gg.InvalidArgument, match="no whole batch of 16 is left"):
                trainer.epoch(one_batch, val_split=0.25)
    finally:
        trainer.close()


def _transposed(ctx):
    """A (4, 3) f32 view whose rows are strided: the transpose of a (3, 4) tensor."""
    return gg.transpose(ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4)))


@pytest.mark.parametrize("op, call", [
    ("pad", lambda t: gg.pad(t, [(0, 1), (0, 1)])),
    ("concat", lambda t: gg.concat(t, t, 0)),
    ("repeat", lambda t: gg.repeat(t, (8, 3))),
])
def test_strided_rows_are_refused_with_the_cont_hint(op, call):
    """ggml_py's layout rule for these ops holds on every backend (CUDA's and Vulkan's kernels
    assert contiguous rows; CPU's may read them): refused before the graph, naming gg.cont."""
    with gg.Context() as ctx:
        t = _transposed(ctx)
        with pytest.raises(gg.InvalidArgument, match=rf"{op}: the rows of a \(4, 3\) are "
                                                     r"strided.*gg\.cont\(a\)"):
            call(t)
        assert call(gg.cont(t)).shape                  # made contiguous, it is taken


def test_concat_of_quantized_blocks_is_refused():
    with gg.Context() as ctx:
        q = ctx.tensor(gg.q8_0, (2, 32))
        with pytest.raises(gg.InvalidType, match="concat: q8_0 blocks cannot be concatenated"):
            gg.concat(q, q, 0)


@pytest.mark.parametrize("strides", [(0, 4), (16, 0), (-16, 4)])
def test_view_strides_must_be_positive(strides):
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 4))
        with pytest.raises(gg.InvalidArgument, match=r"view: (strides must be positive|the "
                                                      r"last stride must be)"):
            gg.view(a, (2, 2), strides=strides)


@pytest.mark.parametrize("axes", [(0, 0), (1, 1), (0, 2), (2, 0, 1)])
def test_permute_axes_must_be_a_permutation(axes):
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (2, 3))
        with pytest.raises(gg.InvalidArgument, match="are not a permutation of 2 axes"):
            gg.permute(a, axes)


def test_a_quantized_tensors_last_axis_stays_last():
    """The last numpy axis of a q8_0 tensor holds its blocks of 32: permutes that move it are
    refused; those that keep it are views like any other."""
    with gg.Context() as ctx:
        q = ctx.tensor(gg.q8_0, (2, 3, 32))
        for axes in [(0, 2, 1), (2, 1, 0), (1, 2, 0)]:
            with pytest.raises(gg.InvalidType, match="the last axis of a q8_0 tensor holds its "
                                                     "quantized blocks and cannot move"):
                gg.permute(q, axes)
        assert gg.permute(q, (1, 0, 2)).shape == (3, 2, 32)


def test_view_rules_one_by_one():
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 4))
        with pytest.raises(gg.InvalidArgument, match="view: 1 strides for 2 axes"):
            gg.view(a, (2, 2), strides=(16,))
        with pytest.raises(gg.InvalidArgument, match="view: 3 strides for 2 axes"):
            gg.view(a, (2, 2), strides=(16, 4, 4))
        with pytest.raises(gg.InvalidArgument, match="the last stride must be the element size "
                                                     "4, got 8"):
            gg.view(a, (2, 2), strides=(16, 8))
        q = ctx.tensor(gg.q8_0, (2, 64))
        with pytest.raises(gg.InvalidType, match="views of quantized tensors are not supported"):
            gg.view(q, (2, 32))
        assert gg.view(a, (2, 2), strides=(16, 4)).shape == (2, 2)


@pytest.mark.parametrize("shape", [(6, 1, 1, 1, 1), (1, 1, 1, 1, 6), (1, 2, 1, 3, 1, 1)])
def test_reshape_to_more_than_four_axes_is_refused(shape):
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (2, 3))
        with pytest.raises(gg.InvalidArgument, match=r"reshape: bad shape .* \(1 to 4 axes"):
            gg.reshape(a, shape)


def test_reshape_keeps_quantized_blocks_whole():
    with gg.Context() as ctx:
        q = ctx.tensor(gg.q8_0, (2, 64))
        assert gg.reshape(q, (4, 32)).shape == (4, 32)
        for shape in [(8, 16), (16, 8), (4, 2, 16)]:
            with pytest.raises(gg.InvalidArgument, match="would split quantized blocks"):
                gg.reshape(q, shape)


@pytest.mark.parametrize("shape", [(-1, -1), (-1, 4), (0, -1), (-1, 2, -1)])
def test_reshape_infers_one_axis_only_when_it_divides(shape):
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (2, 3))
        with pytest.raises(gg.InvalidArgument, match=r"reshape: cannot reshape \(2, 3\) into"):
            gg.reshape(a, shape)
        assert gg.reshape(a, (-1, 2)).shape == (3, 2)


@pytest.mark.parametrize("shape", [(4, 2), (7,), (1, 5), (2, 3, 2)])
def test_reshape_keeps_the_element_count(shape):
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (2, 3))
        with pytest.raises(gg.InvalidArgument, match=r"cannot reshape \(2, 3\) \(6 elements\)"):
            gg.reshape(a, shape)



def test_copy_goes_from_source_to_destination(cpu):
    """gg.copy(src, dst): dst gets src's bytes (it starts as NaN) and src keeps them."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with cpu.backend(n_threads=1) as be, gg.Context() as ctx:
        src, dst = ctx.tensor(gg.f32, (3, 4), "src"), ctx.tensor(gg.f32, (3, 4), "dst")
        ctx.alloc(be)
        src.set(x)
        dst.set(np.full_like(x, np.nan))
        gg.copy(src, dst)
        np.testing.assert_array_equal(dst.numpy(), x)
        np.testing.assert_array_equal(src.numpy(), x)


@pytest.mark.parametrize("bad", ["127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:123456",
                                 "127.0.0.1:-1", "127.0.0.1:5e4", "127.0.0.1:"])
def test_an_endpoint_port_is_1_to_65535(bad):
    with pytest.raises(gg.InvalidArgument, match="must be 1..65535|is not 'host:port'"):
        gg.rpc.parse_endpoint(bad)
    assert gg.rpc.parse_endpoint("127.0.0.1:65535") == ("127.0.0.1", 65535)


@pytest.mark.skipif(not meta_supported(), reason="ggml_py offers meta devices from ggml 0.26.0")
@pytest.mark.parametrize("devices", ["CPU", {"CPU"}, None, 0])
def test_meta_device_takes_a_list_of_devices(devices):
    with pytest.raises(gg.InvalidType, match="meta_device: devices must be a list of devices "
                                             "or names, not"):
        gg.meta_device(devices, {})


@pytest.fixture
def meta_and_cpu(cpu):
    """(meta backend over two CPU parts, CPU backend, w: (8, 4) ones split by rows on the meta
    device, x: (2, 4) ones in CPU memory)."""
    if not meta_supported():
        pytest.skip("ggml_py offers meta devices from ggml 0.26.0")
    md = gg.meta_device([cpu, cpu], {"w": gg.Split(axis=0)})
    with md.backend() as mb, cpu.backend(n_threads=1) as cb, gg.Context() as mc, \
            gg.Context() as hc:
        w = mc.tensor(gg.f32, (8, 4), "w")
        mc.alloc(mb)
        w.set(np.ones((8, 4), np.float32))
        x = hc.tensor(gg.f32, (2, 4), "x")
        hc.alloc(cb)
        x.set(np.ones((2, 4), np.float32))
        yield mb, cb, w, x


def test_a_meta_compute_names_the_buffer_of_a_foreign_leaf(meta_and_cpu):
    mb, _, w, x = meta_and_cpu
    with pytest.raises(gg.GGMLError, match="meta device: x .* lives in a buffer of CPU, not "
                                           "of a meta device"):
        mb.compute(gg.Graph(gg.mul_mat(w, x)))


def test_a_meta_compute_names_the_buffer_of_a_foreign_node(meta_and_cpu):
    """A node computed before on the CPU backend keeps its memory there: a meta compute over
    it is refused by name, with the buffer it lives in."""
    mb, cb, w, x = meta_and_cpu
    z = x + x
    z.name = "z"
    cb.compute(gg.Graph(z))
    with pytest.raises(gg.GGMLError, match="meta device: node z .* lives in a buffer of CPU"):
        mb.compute(gg.Graph(gg.mul_mat(w, z)))


@pytest.mark.skipif(not meta_supported(), reason="ggml_py offers meta devices from ggml 0.26.0")
def test_split_states_follow_a_column_then_row_parallel_mlp(cpu):
    """be.split_states(graph) (notebook 07 prints it): each node's name, op and split as the
    meta backend derives it: w1 split by rows makes h split on its last numpy axis, relu keeps
    it, the second matmul over w2's split inner axis is a partial sum, meta_reduce mirrors it."""
    md = gg.meta_device([cpu, cpu], {"w1": gg.Split(axis=0), "w2": gg.Split(axis=1)})
    with md.backend() as mb, gg.Context() as mc:
        w1, w2 = mc.tensor(gg.f32, (8, 4), "w1"), mc.tensor(gg.f32, (4, 8), "w2")
        x = mc.tensor(gg.f32, (2, 4), "x")
        mc.alloc(mb)
        h = gg.mul_mat(w1, x)
        h.name = "h"
        y = gg.meta_reduce(gg.mul_mat(w2, gg.relu(h)))
        y.name = "y"
        assert mb.split_states(gg.Graph(y)) == [
            ("h", "MUL_MAT", "axis 1 (ggml 0)"), ("node_1", "RELU", "axis 1 (ggml 0)"),
            ("node_2", "MUL_MAT", "PARTIAL"), ("y", "SCALE", "MIRRORED")]


@pytest.mark.parametrize("make", [lambda a: a.T, lambda a: a[:, ::2], lambda a: a[::-1]])
def test_from_dlpack_takes_c_contiguous_memory_only(make):
    """A strided producer (a transpose, a step, a reversal) is refused by name; ggml's tensor
    over it would read the wrong elements."""
    a = make(np.arange(24, dtype=np.float32).reshape(4, 6))
    assert not a.flags.c_contiguous
    with gg.Context() as ctx:
        with pytest.raises(gg.InvalidArgument, match="from_dlpack: the array must be "
                                                     "C-contiguous"):
            gg.dlpack.from_dlpack(a, ctx)


@pytest.mark.parametrize("op", [lambda a: a + a, lambda a: a * 2.0, lambda a: gg.relu(a),
                                lambda a: gg.reshape(a, (4, 2)), lambda a: gg.permute(a, (1, 0)),
                                lambda a: gg.soft_max(a), lambda a: gg.cont(a)])
def test_a_closed_contexts_tensors_build_nothing(op):
    """The checked ops build in C before any Python check: closing a Context first tells its
    C state to refuse (no head chunk), so an op on its tensors raises ClosedError instead of
    building in released records."""
    ctx = gg.Context(capacity=16)
    a = ctx.tensor(gg.f32, (2, 4), "a")
    ctx.close()
    for _ in range(3):
        with pytest.raises(gg.ClosedError):
            op(a)


@pytest.mark.skipif(not meta_supported(), reason="ggml_py offers meta devices from ggml 0.26.0")
def test_meta_memory_is_not_host_memory(cpu):
    """ggml calls a meta device's buffer type host memory; its tensors' addresses are
    placeholders, so ggml_py does not (tests/core/test_meta_memory.py has the readers)."""
    md = gg.meta_device([cpu, cpu], {"m": gg.Split(axis=0)})
    with md.backend() as mb, gg.Context() as mc:
        m = mc.tensor(gg.f32, (8, 4), "m")
        mc.alloc(mb)
        assert gg.lib.ggml_backend_buft_is_host(m.buffer.buffer_type.ptr)
        assert not m.is_host and not m.buffer.is_host and not m.buffer.buffer_type.is_host
        assert cpu.buffer_type.is_host
