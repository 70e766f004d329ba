"""Refusals the mutation sample (docs/mutation.md, tools/mutants.py) showed no fast, in-process
test asserted: each case removes one `require`/`rows` rule when its check is mutated away, and
must then fail here (the wrong exception, or none). Most were covered only by the corpus, whose
child process runs last and past the mutants' test cap."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import opt
from support import ROOT, child_env


@pytest.fixture
def g():
    ctx = gg.Context()
    e = dict(
        ctx=ctx,
        rect=ctx.tensor(gg.f32, (4, 8), "rect"),
        sq=ctx.tensor(gg.f32, (8, 8), "sq"),
        h=ctx.tensor(gg.f16, (8, 8), "h"),
        q=ctx.tensor(gg.q4_0, (4, 64), "q"),
        a4=ctx.tensor(gg.f32, (2, 1, 4, 8), "a4"),
        b4=ctx.tensor(gg.f32, (3, 1, 4, 8), "b4"),
    )
    yield e
    ctx.close()


# (exception, words in the message, the call)
CASES = {
    "backend params with NUL": (gg.InvalidArgument, "NUL", lambda e, cpu: cpu.backend(params="a\x00b")),
    "from_numpy object array": (gg.InvalidType, "object", lambda e, cpu: e["ctx"].from_numpy(np.array([object()], dtype=object))),
    "tensor over 2**62 bytes": (gg.OutOfMemory, "address", lambda e, cpu: e["ctx"].tensor(gg.f64, (2**29, 2**30))),
    "shape over 2**60 elements": (gg.OutOfMemory, "address", lambda e, cpu: e["ctx"].tensor(gg.f32, (2**31, 2**31))),
    "flash_attn_ext of a strided q": (gg.InvalidArgument, "strided", lambda e, cpu: gg.flash_attn_ext(
        gg.transpose(e["ctx"].tensor(gg.f32, (1, 2, 64, 4))),
        e["ctx"].tensor(gg.f16, (1, 2, 4, 64)), e["ctx"].tensor(gg.f16, (1, 2, 4, 64)))),
    "q4_0 row not whole blocks": (gg.InvalidArgument, "block size", lambda e, cpu: e["ctx"].tensor(gg.q4_0, (2, 48))),
    "pool_2d of f16": (gg.InvalidType, "f32", lambda e, cpu: gg.pool_2d(e["h"], 2)),
    "relu of a transposed view": (gg.InvalidArgument, "strided", lambda e, cpu: gg.relu(e["rect"].T)),
    "norm of a transposed view": (gg.InvalidArgument, "strided", lambda e, cpu: gg.norm(e["rect"].T)),
    "sum of a transposed view": (gg.InvalidArgument, "strided", lambda e, cpu: gg.sum(e["rect"].T)),
    "mean of a transposed view": (gg.InvalidArgument, "strided", lambda e, cpu: gg.mean(e["rect"].T)),
    "cumsum of a transposed view": (gg.InvalidArgument, "strided", lambda e, cpu: gg.cumsum(e["rect"].T)),
    "transpose quantized": (gg.InvalidType, "quantized", lambda e, cpu: gg.transpose(e["q"])),
    "view strides for other axes": (gg.InvalidArgument, "strides", lambda e, cpu: gg.view(e["sq"], (8, 8), 0, (32,))),
    "out_prod batch not a multiple": (gg.InvalidArgument, "multiples", lambda e, cpu: gg.out_prod(e["b4"], e["a4"])),
    "flash_attn_ext batch differs": (gg.InvalidArgument, "batch", lambda e, cpu: gg.flash_attn_ext(
        e["ctx"].tensor(gg.f32, (1, 2, 4, 64)), e["ctx"].tensor(gg.f16, (2, 2, 4, 64)),
        e["ctx"].tensor(gg.f16, (2, 2, 4, 64)))),
    "conv_2d of a transposed kernel": (gg.InvalidArgument, "kernel must be contiguous", lambda e, cpu: gg.conv_2d(
        gg.transpose(e["ctx"].tensor(gg.f32, (2, 4, 3, 3))), e["ctx"].tensor(gg.f32, (1, 4, 8, 8)))),
    "cpy into a permuted quantized tensor": (gg.InvalidArgument, "quantized destination must be contiguous",
                                          lambda e, cpu: gg.cpy(e["ctx"].tensor(gg.f32, (3, 2, 4, 64)),
                                                                gg.permute(e["ctx"].tensor(gg.q4_0, (2, 3, 4, 64)), (1, 0, 2, 3)))),
    "tensor name with NUL": (gg.InvalidArgument, "NUL", lambda e, cpu: setattr(e["rect"], "name", "a\x00b")),
    "flash_attn_ext mask batch not dividing q's": (gg.InvalidArgument, "mask batch dims", lambda e, cpu: gg.flash_attn_ext(
        e["ctx"].tensor(gg.f32, (1, 2, 4, 64)), e["ctx"].tensor(gg.f16, (1, 2, 8, 64)),
        e["ctx"].tensor(gg.f16, (1, 2, 8, 64)), e["ctx"].tensor(gg.f16, (3, 64, 8)))),
    "scheduler of a generator": (gg.InvalidType, "needs a list", lambda e, cpu: gg.Scheduler(b for b in [cpu.backend()])),
    "quantize rows not whole blocks": (gg.InvalidArgument, "do not split into q4_0 blocks of 32",
                                       lambda e, cpu: gg.quantize(np.ones((2, 48), np.float32), gg.q4_0)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_by_its_rule(g, cpu, case):
    exc, words, call = CASES[case]
    with pytest.raises(exc, match=words):
        call(g, cpu)


def test_numpy_copy_must_be_a_bool(cpu):
    be = cpu.backend()
    with gg.Context() as ctx:
        t = ctx.from_numpy(np.arange(4, dtype=np.float32))
        with pytest.raises(gg.InvalidType, match="copy"):
            t.numpy(copy="yes")
        ctx.alloc(be)
        t.set(np.arange(4, dtype=np.float32))
        assert t.numpy(copy=True).tolist() == [0, 1, 2, 3]
    be.close()


def test_scheduler_computes_only_graphs(cpu):
    be = cpu.backend()
    sched = gg.Scheduler([be])
    with pytest.raises(gg.InvalidType, match="Graph"):
        sched.compute("not a graph")
    sched.close()
    be.close()


@pytest.fixture
def one_layer(cpu):
    """(backend, context, inputs x, weight w) of a one-matmul model on the CPU."""
    be = cpu.backend()
    ctx = gg.Context()
    x = ctx.tensor(gg.f32, (16, 2), "x")
    w = ctx.tensor(gg.f32, (3, 2), "w")
    ctx.alloc(be)
    w.set(np.ones((3, 2), np.float32))
    yield be, ctx, x, w
    ctx.close()
    be.close()


def test_optimizer_eps_must_not_be_negative(one_layer):
    be, ctx, x, w = one_layer
    trainer = opt.Optimizer(be, x, gg.mul_mat(w, x), [w])
    trainer.set_hyperparameters(eps=1e-8)
    with pytest.raises(gg.InvalidArgument, match="eps"):
        trainer.set_hyperparameters(eps=-1.0)
    trainer.close()


def test_values_read_from_ggml(cpu):
    """Values ggml reports, each checked against what is known independently (a skipped call
    gives 0, NULL or an empty name)."""
    be = cpu.backend()
    assert be.name == "CPU"
    assert (gg.f32.type_size, gg.f16.type_size, gg.q4_0.type_size, gg.q4_0.block_size) == (4, 2, 18, 32)
    with gg.Context() as ctx:
        ctx.tensor(gg.f32, (4, 8))
        ctx.tensor(gg.f32, (1, 8))
        assert ctx.n_tensors() == 2
    be.close()


def test_buffer_type_support_read_from_ggml(cpu, rpc_devs):
    be, rb = cpu.backend(), rpc_devs[0].backend()
    try:
        assert be.supports_buffer_type(cpu.buffer_type) is True
        assert cpu.supports_buffer_type(cpu.buffer_type) is True
        assert rb.supports_buffer_type(rpc_devs[0].buffer_type) is True
        assert rpc_devs[0].supports_buffer_type(rpc_devs[0].buffer_type) is True
        assert rpc_devs[0].supports_buffer_type(cpu.buffer_type) is False
    finally:
        be.close(); rb.close()


def test_backend_supports_op_asks_its_device(cpu):
    be = cpu.backend()
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 8))
        assert be.supports_op(a + a) is True
        assert be.supports_op(a + a) == cpu.supports_op(a + a)
    be.close()


def test_status_check_maps_ggml_statuses():
    from ggml_py import errors
    assert errors.check_status(0, "x") is None
    with pytest.raises(gg.OutOfMemory, match="x failed: .*status -2"):
        errors.check_status(-2, "x")           # GGML_STATUS_ALLOC_FAILED
    with pytest.raises(gg.GGMLError, match="x failed: .*status -1") as e:
        errors.check_status(-1, "x")           # GGML_STATUS_FAILED
    assert not isinstance(e.value, gg.OutOfMemory)


def test_records_left_without_helpers_matches_helpers():
    from ggml_py import _context_records
    from ggml_py._loader import lib
    with gg.Context() as ctx:
        ctx.tensor(gg.f32, (4,))
        raw = ctx._raws()[-1]
        left = _context_records._records_left_py(raw)
        assert left > 0
        if hasattr(lib, "ggml_py_room"):
            assert left == int(lib.ggml_py_room(raw))


def test_fill_bytes_writes_every_byte(cpu):
    """The Vulkan path of Buffer.clear, called directly on CPU memory."""
    be = cpu.backend()
    with gg.Context() as ctx:
        t = ctx.tensor(gg.i8, (64,)) if hasattr(gg, "i8") else ctx.tensor(gg.f32, (16,))
        ctx.alloc(be)
        t.buffer.clear(0)
        t.buffer._fill_bytes(7)
        assert set(t.numpy().view(np.uint8).tolist()) == {7}
    be.close()


def test_wait_takes_only_events(cpu, rpc_devs):
    """The argument's kind is checked before the device's capabilities (CPU has no events)."""
    be, rb = cpu.backend(), rpc_devs[0].backend()
    try:
        for b in (be, rb):
            with pytest.raises(gg.InvalidType, match="expected an Event"):
                b.wait("not an event")
    finally:
        be.close(); rb.close()


def test_buffer_usage_names_are_checked(cpu):
    be = cpu.backend()
    with gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (4,))
        ctx.alloc(be)
        buf = t.buffer
        buf.usage = "weights"
        assert buf.usage == "weights"
        with pytest.raises(gg.InvalidArgument, match="usage must be one of"):
            buf.usage = "bogus"
        assert buf.usage == "weights"
    be.close()



def test_loaded_tensors_carry_the_files_names(tmp_path):
    from ggml_py import gguf
    p = tmp_path / "n.gguf"
    gguf.write(p, {"general.architecture": "x"},
               {"blk.0.w": np.arange(6, dtype=np.float32).reshape(2, 3), "out": np.ones(4, np.float32)})
    with gguf.read(p) as f:
        for copy in (True, False):
            ts = f.load(gg.device("CPU"), copy=copy)
            assert {n: t.name for n, t in ts.items()} == {"blk.0.w": "blk.0.w", "out": "out"}
            assert ts["blk.0.w"].numpy().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_repack_buffer_type_refusal_names_the_default(cpu):
    repack = [b for b in cpu.buffer_types if not b.holds_plain_bytes]
    if not repack:
        pytest.skip("this build's CPU has no repacking buffer type")
    with pytest.raises(gg.UnsupportedError, match="use CPU's default buffer type"):
        repack[0].require_plain_bytes("x")



def test_scheduler_refuses_a_backend_not_its_own(cpu):
    be, other = cpu.backend(), cpu.backend()
    try:
        with gg.Context() as ctx, gg.Scheduler([be]) as sched:
            a = ctx.tensor(gg.f32, (4,))
            with pytest.raises(gg.InvalidArgument, match="not one of the scheduler's"):
                sched.set_backend(a + a, other)
            with pytest.raises(gg.InvalidArgument, match="not one of the scheduler's"):
                sched.buffer_size(other)
    finally:
        be.close(); other.close()


def test_partial_get_reads_the_bytes_at_the_offset(cpu, rpc_devs):
    """Backend.get into a smaller array at an offset (the partial path): the array starts as
    NaN, unlike anything the tensor holds."""
    for dev in (cpu, rpc_devs[0]):
        be = dev.backend()
        with gg.Context() as ctx:
            t = ctx.tensor(gg.f32, (8,))
            ctx.alloc(be)
            t.set(np.arange(8, dtype=np.float32))
            out = np.full(3, np.nan, np.float32)
            be.get(t, out, offset=4 * 2)
            assert out.tolist() == [2.0, 3.0, 4.0]
        be.close()


def test_optimizer_refusals(one_layer):
    be, ctx, x, w = one_layer
    with pytest.raises(gg.InvalidArgument, match="opt_period"):
        opt.Optimizer(be, x, gg.mul_mat(w, x), [w], opt_period=0)
    with pytest.raises(gg.InvalidArgument, match="optimizer must be one of"):
        opt.Optimizer(be, x, gg.mul_mat(w, x), [w], optimizer="lbfgs")
    with gg.Context() as c2:
        w2 = c2.tensor(gg.f32, (3, 2), "w2")                 # never allocated
        with pytest.raises(gg.InvalidArgument, match="parameter w2 has no memory"):
            opt.Optimizer(be, x, gg.mul_mat(w2, x), [w2])


def test_broadcast_mul_mat_has_no_gradient(one_layer):
    """ggml has no backward pass of a mul_mat whose batch axes broadcast (Optimizer refuses the
    shape before this rule: opt.gradients is the way in)."""
    be, ctx, x, w = one_layer
    with gg.Context() as c2:
        a = c2.tensor(gg.f32, (1, 3, 4))                      # ne (4, 3, 1)
        b = c2.tensor(gg.f32, (2, 5, 4))                      # ne (4, 5, 2): batch 2 over 1
        c2.alloc(be)
        a.set(np.ones((1, 3, 4), np.float32))
        b.set(np.ones((2, 5, 4), np.float32))
        with pytest.raises(gg.InvalidArgument, match="broadcast mul_mat"):
            opt.gradients(gg.sum(gg.mul_mat(a, b)), [a], be)
        # the same product without broadcasting is differentiated (the rule is that narrow)
        a2 = c2.tensor(gg.f32, (2, 3, 4))
        c2.alloc(be)
        a2.set(np.ones((2, 3, 4), np.float32))
        (da,) = opt.gradients(gg.sum(gg.mul_mat(a2, b)), [a2], be)
        assert da.shape == (2, 3, 4) and np.allclose(da, 5.0)


def test_tensors_listed_in_creation_order_across_chunks():
    """A Context opens a new chunk when the Python path asks for more room than is left; the
    checked ops (helpers.c) must then build in that chunk too, or a tensor made later lands
    in the old chunk and tensors() (creation order) lists it before older ones."""
    with gg.Context(capacity=8) as ctx:                       # chunks of about 70 records
        a = ctx.tensor(gg.f32, (4,))
        made = [a]
        for _ in range(120):                                  # past the first chunk
            made.append(gg.sum(a))                            # the Python path (asks for 4)
            made.append(a + a)                                # a checked op, when helpers.c is
        assert len(ctx.spans()) >= 2
        listed = ctx.tensors
        assert len(listed) == len(made)
        assert all(t.ptr == m.ptr for t, m in zip(listed, made))


def test_buffer_of_a_dead_rpc_server_raises_and_the_process_survives():
    """A buffer keeps its device to ask whether the server is alive: clear and close of a
    buffer whose RPC server died raise or warn (ggml's client would abort the process). In a
    fresh process: the dead server's device stays registered with ggml for good."""
    code = textwrap.dedent("""
        import warnings, ggml_py as gg
        srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
        buf = dev.buffer_type.alloc(1024)
        buf.clear(3)
        srv.kill()
        try:
            buf.clear(0)
        except ConnectionError as e:
            print("raised", "gone" in str(e))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            buf.close()                                       # dropped, not freed
        print("warned", sum("RPC server is gone" in str(x.message) for x in w))
        print("survived")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=child_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:3] == ["raised True", "warned 1", "survived"], r.stdout


@pytest.mark.parametrize("where", ["CPU", "RPC"])
def test_every_output_of_a_graph_keeps_its_value(cpu, rpc_devs, where):
    """Graph([y1, z]): y1 is an output although later nodes read it, so the graph allocator
    must not hand its memory to them (ggml_set_output) and y1 reads its own value afterwards."""
    be = (cpu if where == "CPU" else rpc_devs[0]).backend()
    x0 = np.arange(1, 65, dtype=np.float32)
    with gg.Context() as ctx:
        x = ctx.from_numpy(x0)
        ctx.alloc(be)
        y1 = x + x                                   # (no memory of its own: the graph's)
        z = gg.relu(y1)
        for _ in range(4):
            z = gg.relu(z * 3.0) + x
        be.compute(gg.Graph([y1, z]))
        want = x0 + x0
        zw = np.maximum(want, 0)
        for _ in range(4):
            zw = np.maximum(zw * 3, 0) + x0
        assert np.array_equal(y1.numpy(), want)
        assert np.array_equal(z.numpy(), zw)
    be.close()


def test_compute_refusal_names_the_buffer_type(cpu, rpc_devs):
    """A CPU backend computing on a tensor in an RPC buffer: the refusal names that buffer
    type as ggml does."""
    import re
    be, rb = cpu.backend(), rpc_devs[0].backend()
    try:
        with gg.Context() as ctx:
            a = ctx.tensor(gg.f32, (4,), "a")
            ctx.alloc(rb)
            name = rpc_devs[0].buffer_type.name
            assert name.startswith("RPC")
            with pytest.raises(gg.InvalidArgument,
                               match=f"'a' lives in a {re.escape(name)} buffer, which backend CPU"):
                be.compute(gg.Graph(a + a))
    finally:
        be.close(); rb.close()


def test_meta_backend_takes_no_thread_count(rpc_devs):
    from support.meta_models import meta_supported
    if not meta_supported():
        pytest.skip("ggml_py offers meta devices from ggml 0.26.0")
    md = gg.meta_device(rpc_devs, {})
    with pytest.raises(gg.UnsupportedError, match="takes no n_threads"):
        md.backend(n_threads=2)
    with md.backend() as be:                          # (the default is taken)
        assert be.device is md


def test_meta_split_sizes_must_be_whole_blocks(rpc_devs):
    """Split(sizes=...) along a quantized row: each part must hold whole blocks (32 for q4_0);
    sizes of whole blocks are taken."""
    from support.meta_models import meta_supported
    if not meta_supported():
        pytest.skip("ggml_py offers meta devices from ggml 0.26.0")
    md = gg.meta_device(rpc_devs, {"w": gg.Split(axis=-1, sizes=[16, 48])})
    with md.backend() as be, gg.Context() as ctx:
        ctx.tensor(gg.q4_0, (4, 64), "w")
        with pytest.raises(gg.InvalidArgument, match="multiple of the type's block size 32"):
            ctx.alloc(be)
    md = gg.meta_device(rpc_devs, {"w": gg.Split(axis=-1, sizes=[32, 32])})
    with md.backend() as be, gg.Context() as ctx:
        ctx.tensor(gg.q4_0, (4, 64), "w")
        ctx.alloc(be)


@pytest.mark.parametrize("where", ["CPU", "RPC"])
def test_computing_a_graph_again_reads_the_new_inputs(cpu, rpc_devs, where):
    """The second compute of an unchanged graph on the same backend takes the validated fast
    path: it must still compute (new input values, new result)."""
    be = (cpu if where == "CPU" else rpc_devs[0]).backend()
    with gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (8,))
        ctx.alloc(be)
        y = x * 3.0
        g = gg.Graph(y)
        for k in range(1, 4):
            x.set(np.full(8, k, np.float32))
            be.compute(g)
            assert y.numpy().tolist() == [3.0 * k] * 8
    be.close()


def test_epoch_shuffles_only_when_asked(cpu):
    """SGD with one data point a step: the order of the points changes the trained weights,
    so an epoch with shuffle=True (ggml_opt_dataset_shuffle) differs from one without, and
    two epochs without shuffling agree."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((8, 2)).astype(np.float32)
    Y = rng.standard_normal((8, 3)).astype(np.float32)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    be = cpu.backend(n_threads=1)

    def one_epoch(shuffle):
        with gg.Context() as ctx:
            x = ctx.tensor(gg.f32, (1, 2), "x")
            w = ctx.tensor(gg.f32, (3, 2), "w")
            ctx.alloc(be)
            w.set(w0)
            trainer = opt.Optimizer(be, x, gg.mul_mat(w, x), [w], loss="mse", optimizer="sgd",
                                    lr=0.2)
            data = opt.Dataset(X, Y)
            trainer.epoch(data, shuffle=shuffle)
            got = w.numpy().copy()
            trainer.close()
            data.close()
        return got

    try:
        plain, again, shuffled = one_epoch(False), one_epoch(False), one_epoch(True)
        assert np.array_equal(plain, again)
        assert not np.allclose(plain, shuffled)
    finally:
        be.close()
