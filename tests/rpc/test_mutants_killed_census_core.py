"""Tests written against survivors of the census of every mutant (docs/mutation.md): backend,
context, device, optimizer, split, transfer and scheduler rules. Each fails when its mutant
(tools/must_kill.txt) is applied and passes without."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import opt
from support import ROOT, child_env
from support.meta_models import meta_supported

needs_meta = pytest.mark.skipif(not meta_supported(),
                                reason="ggml_py offers meta devices from ggml 0.26.0")


# -- thread counts, contexts ------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, 10**6, True, 2.0, "4", np.int32(0)])
def test_a_thread_count_is_an_int_in_range(cpu, bad):
    """One rule for every thread count (Device.backend(n_threads=), Backend.n_threads,
    rpc.serve(threads=)): an int (not a bool) in 1..GGML_MAX_N_THREADS, refused by name before
    a backend or a server is started."""
    with pytest.raises(gg.InvalidArgument, match=r"n_threads must be an int in 1\.\.\d+, got"):
        cpu.backend(n_threads=bad)
    with cpu.backend(n_threads=1) as be:
        with pytest.raises(gg.InvalidArgument, match=r"n_threads must be an int in 1\.\.\d+"):
            be.n_threads = bad
        assert be.n_threads == 1
    with pytest.raises(gg.InvalidArgument, match=r"serve: threads must be an int in 1\.\.\d+"):
        gg.rpc.serve(threads=bad)


def test_thread_counts_at_the_bounds_are_taken(cpu):
    with cpu.backend(n_threads=np.int64(1)) as be:
        assert be.n_threads == 1 and type(be.n_threads) is int


@pytest.mark.parametrize("bad", [0, -1, -4096, (1 << 26) + 1])
def test_a_context_capacity_is_in_range(bad):
    """A context holds 1..2**26 tensor records; 0, negatives and more are refused by name
    before any ggml_context is made."""
    with pytest.raises(gg.InvalidArgument, match=r"Context: capacity must be in 1\.\.67108864, "
                                                 rf"got {bad}"):
        gg.Context(bad)


# -- devices and buffer types -----------------------------------------------------------------
def test_buffer_from_host_refuses_arrays_ggml_cannot_write_through(cpu):
    """A host-memory buffer is the array's own memory, which ggml writes through: the array
    must be C-contiguous, writable and not empty (refused by name, each)."""
    base = gg.aligned_empty((8, 8), np.float32)
    with pytest.raises(gg.InvalidArgument, match="buffer_from_host: the array must be "
                                                 "C-contiguous"):
        cpu.buffer_from_host(base.T)
    ro = gg.aligned_empty((16,), np.float32)
    ro.flags.writeable = False
    with pytest.raises(gg.InvalidArgument, match="buffer_from_host: the array is read-only"):
        cpu.buffer_from_host(ro)
    for empty in (gg.aligned_empty((0,), np.float32), gg.aligned_empty((4, 0), np.float32)):
        with pytest.raises(gg.InvalidArgument, match="buffer_from_host: the array is empty"):
            cpu.buffer_from_host(empty)


def test_buffer_from_host_is_a_host_buffer_of_the_cpus_mapped_type(cpu):
    """The buffer made over an array has ggml's buffer type for it (CPU_Mapped): a host type,
    with the device's alignment, over the array's own bytes."""
    arr = gg.aligned_empty((16,), np.float32)
    buf = cpu.buffer_from_host(arr)
    bt = buf.buffer_type
    assert isinstance(bt, gg.BufferType)
    assert bt.name == "CPU_Mapped" and bt.is_host
    assert bt.alignment == cpu.buffer_type.alignment
    assert buf.size == arr.nbytes and buf.base == arr.ctypes.data


@pytest.mark.parametrize("bad", ["GPU", "cuda", "meta", "", "CPU"])
def test_device_by_type_takes_only_the_known_types(bad):
    """gg.device(type=...) takes 'cpu', 'gpu', 'igpu' or 'accel' only; another word is refused
    (not answered with NotFound as if no such device were present)."""
    with pytest.raises(gg.InvalidArgument, match=rf"unknown device type {bad!r}: use 'cpu', "
                                                 "'gpu', 'igpu' or 'accel'"):
        gg.device(type=bad)
    assert gg.device(type="cpu").type == "cpu"


def _repack(cpu):
    extra = [b for b in cpu.buffer_types if b != cpu.buffer_type and b != cpu.host_buffer_type]
    if not extra:
        pytest.skip("this build's CPU has no extra buffer type")
    return extra[0]


def test_the_cpus_extra_buffer_types_do_not_hold_plain_bytes(cpu):
    """CPU_REPACK (and the other extra types) rearrange tensors for their kernels: they are
    not plain bytes, and nothing of ggml_py allocates there; the default type is plain."""
    rp = _repack(cpu)
    assert cpu.buffer_type.holds_plain_bytes
    assert not rp.holds_plain_bytes
    with pytest.raises(gg.UnsupportedError, match=f"alloc: buffer type {rp.name} keeps tensors "
                                                  "in its kernels' own layout"):
        rp.alloc(1024)
    with pytest.raises(gg.UnsupportedError, match="keeps tensors in its kernels' own layout"):
        rp.require_plain_bytes("test")
    with cpu.buffer_type.alloc(1024) as buf:
        assert buf.size == 1024


def test_alloc_on_a_buffer_type_whose_server_died_raises_and_the_process_survives():
    """BufferType.alloc asks whether the type's RPC server is alive before ggml's client
    allocates there (which would abort the process). In a fresh process: the dead server's
    device stays registered with ggml for good."""
    code = textwrap.dedent("""
        import ggml_py as gg
        srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
        buft = dev.buffer_type
        srv.kill()
        try:
            buft.alloc(4096)
        except gg.RPCError as e:
            print("raised", "is gone" in str(e))
        print("survived")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=child_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["raised True", "survived"], r.stdout


# -- the optimizer's tensors ------------------------------------------------------------------
def test_optimizer_inputs_and_outputs_must_be_tensors(small_model):
    be, ctx, x, W = small_model
    y = gg.mul_mat(W, x)
    for inputs, outputs in ((np.ones((16, 2), np.float32), y), (x, np.ones((16, 3))),
                            ("x", y), (x, None)):
        with pytest.raises(gg.InvalidArgument, match="inputs and outputs must be Tensors"):
            opt.Optimizer(be, inputs, outputs, [W])


def test_optimizer_inputs_are_batch_by_features(small_model):
    """The inputs are a (batch, features) matrix and the outputs (batch, n): other ranks are
    refused by name before ggml_opt_init."""
    be, ctx, x, W = small_model
    x3 = ctx.tensor(gg.f32, (4, 4, 2), "x3")
    ctx.alloc(be)
    with pytest.raises(gg.InvalidArgument, match=r"inputs must be \(batch, features\) and "
                                                 r"outputs \(batch, n\); got \(4, 4, 2\)"):
        opt.Optimizer(be, x3, gg.mul_mat(W, x3), [W])


def test_cross_entropy_needs_f32_logits(small_model):
    be, ctx, x, W = small_model
    with gg.Context() as c2:
        y16 = c2.tensor(gg.f16, (16, 3), "y16")
        logits = gg.cpy(gg.mul_mat(W, x), y16)
        with pytest.raises(gg.InvalidArgument, match="cross entropy needs f32 outputs"):
            opt.Optimizer(be, x, logits, [W], loss="cross_entropy")


# -- splits of the meta device ----------------------------------------------------------------
@pytest.mark.parametrize("bad", ["0", 0.0, None, True, [0]])
def test_split_axis_is_an_int(bad):
    with pytest.raises(gg.InvalidType, match=r"Split: axis must be an int \(numpy order\)"):
        gg.Split(bad)
    with pytest.raises(gg.InvalidType, match=r"Split: axis must be an int"):
        gg.Split(axis=bad, sizes=[1, 1])


def test_split_takes_sizes_or_segments_not_both_and_at_most_16_segments():
    with pytest.raises(gg.InvalidArgument, match="give sizes .* or segments .*, not both"):
        gg.Split(axis=0, sizes=[2, 2], segments=[2, 2])
    with pytest.raises(gg.InvalidArgument, match="Split: at most 16 segments, got 17"):
        gg.Split(axis=0, segments=[1] * 17)
    assert gg.Split(axis=0, segments=[1] * 16).segments == (1,) * 16


@needs_meta
def test_segmented_splits_are_on_the_last_two_axes(rpc_devs):
    """ggml reads and writes segmented (fused) tensors split on their last two numpy axes
    only: a segmented split of the first axis of a 3-d tensor is refused at allocation."""
    md = gg.meta_device(rpc_devs, {"w": gg.Split(axis=0, segments=[1, 1])})
    with md.backend() as be, gg.Context() as ctx:
        ctx.tensor(gg.f32, (2, 4, 8), "w")
        with pytest.raises(gg.InvalidArgument, match="segmented tensors split on their last "
                                                     "two numpy axes only"):
            ctx.alloc(be)


@needs_meta
def test_even_splits_of_a_quantized_axis_keep_whole_blocks(rpc_devs):
    """Each segment of a quantized row is cut into whole blocks (32 for q4_0): a segment of
    16 elements is refused at allocation."""
    md = gg.meta_device(rpc_devs, {"w": gg.Split(axis=-1, segments=[16, 48])})
    with md.backend() as be, gg.Context() as ctx:
        ctx.tensor(gg.q4_0, (4, 64), "w")
        with pytest.raises(gg.InvalidArgument, match="the axis length 16 is not a multiple of "
                                                     "the type's block size 32"):
            ctx.alloc(be)


# -- copies -----------------------------------------------------------------------------------
@pytest.fixture
def pair(cpu):
    with cpu.backend(n_threads=1) as be, gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 4), "a")
        b = ctx.tensor(gg.f32, (4, 4), "b")
        h = ctx.tensor(gg.f16, (4, 4), "h")
        t = ctx.tensor(gg.f32, (4, 4), "t")
        ctx.alloc(be)
        a.set(np.arange(16, dtype=np.float32).reshape(4, 4))
        yield be, a, b, h, t


def test_copy_refuses_other_layouts_and_the_same_tensor(pair):
    be, a, b, h, t = pair
    with pytest.raises(gg.InvalidArgument, match=r"copy: tensors differ in type or layout "
                                                 r"\(f32\(4, 4\) -> f16\(4, 4\)\)"):
        gg.copy(a, h)
    with pytest.raises(gg.InvalidArgument, match=r"copy: tensors differ in type or layout"):
        gg.copy(a, t.T)
    with pytest.raises(gg.InvalidArgument, match="copy: source and destination are the same "
                                                 "tensor"):
        gg.copy(a, a)
    gg.copy(a, b)
    np.testing.assert_array_equal(b.numpy(), a.numpy())


@pytest.mark.parametrize("bad", ["CPU", None, 0])
def test_copy_async_takes_backends(pair, cpu, bad):
    be, a, b, h, t = pair
    with pytest.raises(gg.InvalidType, match="copy_async: src_backend must be a Backend"):
        gg.copy_async(a, b, bad, be)
    with pytest.raises(gg.InvalidType, match="copy_async: dst_backend must be a Backend"):
        gg.copy_async(a, b, be, bad)
    with pytest.raises(gg.InvalidType, match="copy_async: src_backend must be a Backend"):
        gg.copy_async(a, b, cpu, be)                 # a Device is not its queue


def test_copy_async_refuses_the_same_tensor(pair):
    be, a, b, h, t = pair
    with pytest.raises(gg.InvalidArgument, match="copy_async: source and destination are the "
                                                 "same tensor"):
        gg.copy_async(a, a, be, be)
    gg.copy_async(a, b, be, be)
    be.synchronize()
    np.testing.assert_array_equal(b.numpy(), a.numpy())


@needs_meta
def test_copy_async_into_host_type_memory_of_another_device(cpu):
    """Memory whose buffer type is host memory passes for a copy on any backend, even where
    the buffer type belongs to another device: here a meta device over two CPU parts (its
    buffer type is a host type of the meta device), written through the CPU backend."""
    md = gg.meta_device([cpu, cpu], {"m": gg.Split(axis=0)})
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    with md.backend() as mb, cpu.backend(n_threads=1) as cb, gg.Context() as mc, \
            gg.Context() as hc:
        m = mc.tensor(gg.f32, (8, 4), "m")
        mc.alloc(mb)
        h = hc.tensor(gg.f32, (8, 4), "h")
        hc.alloc(cb)
        h.set(x)
        assert m.buffer.buffer_type != cpu.buffer_type
        assert gg.lib.ggml_backend_buft_is_host(m.buffer.buffer_type.ptr)   # ggml's answer
        gg.copy_async(h, m, cb, cb)
        cb.synchronize()
        np.testing.assert_array_equal(m.numpy(copy=True), x)


# -- the scheduler ----------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["CPU", None, "device"])
def test_scheduler_methods_take_a_backend(cpu, bad):
    with cpu.backend(n_threads=1) as be, gg.Scheduler([be]) as sched, gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4,), "a")
        if bad == "device":
            bad = cpu
        with pytest.raises(gg.InvalidType, match="set_backend: expected a Backend, not"):
            sched.set_backend(a, bad)


def test_scheduler_reset_drops_the_placement(cpu, rng):
    """reset() drops what the scheduler placed: backend_of answers None for its nodes until
    the next allocation."""
    x = rng.standard_normal((4, 4)).astype(np.float32)
    with cpu.backend(n_threads=1) as be, gg.Context() as ctx, gg.Scheduler([be]) as sched:
        a = ctx.from_numpy(x)
        ctx.alloc(be)
        a.set(x)
        out = gg.relu(a @ a)
        g = gg.Graph(out)
        sched.alloc(g)
        assert sched.backend_of(out) is be
        sched.reset()
        assert sched.backend_of(out) is None
        sched.compute(g)
        assert sched.backend_of(out) is be
