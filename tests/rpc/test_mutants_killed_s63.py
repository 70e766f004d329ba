"""Tests written against the survivors of the seed-63 mutation sample (docs/mutation.md,
round 6): each fails when its mutant (tools/must_kill.txt) is applied and passes without."""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import opt
from support import ROOT, child_env, needs_release


def test_device_takes_a_key_or_a_type_not_both():
    with pytest.raises(gg.InvalidArgument, match="not both"):
        gg.device("CPU", type="cpu")
    with pytest.raises(gg.InvalidArgument, match="not both"):
        gg.device(0, type="gpu")


def test_alloc_on_a_dead_rpc_server_raises_and_the_process_survives():
    """Context.alloc asks whether the buffer type's RPC server is alive before ggml's client
    allocates there (which would abort the process). In a fresh process: the dead server's
    device stays registered with ggml for good."""
    code = textwrap.dedent("""
        import ggml_py as gg
        srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
        buft = dev.buffer_type
        ctx = gg.Context()
        ctx.tensor(gg.f32, (64,))
        srv.kill()
        try:
            ctx.alloc(buft)
        except ConnectionError as e:
            print("raised", "gone" in str(e))
        print("survived")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=child_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["raised True", "survived"], r.stdout


@needs_release("0.23.0", "events on RPC devices")
def test_event_record_takes_a_backend(rpc_devs):
    with rpc_devs[0].event() as ev:
        with pytest.raises(gg.InvalidType, match="expected a Backend, not Device"):
            ev.record(rpc_devs[0])


def test_a_checked_op_waits_while_python_holds_the_context():
    """Python holds the context's C mutex wherever it builds in or walks its chunks
    (Context._records), so a checked op of another thread (helpers.c, the GIL released) waits
    for it: ggml never sees two threads in one ggml_context."""
    with gg.Context() as ctx:
        if ctx.checked_state is None:
            pytest.skip("no checked ops in this build (helpers.c)")
        a = ctx.tensor(gg.f32, (8,))
        built = threading.Event()

        def other() -> None:
            a + a
            built.set()
        th = threading.Thread(target=other)
        with ctx._records():
            th.start()
            assert not built.wait(0.5)        # blocked on the mutex
        th.join(30)
        assert built.is_set()


def _rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc/self/statm")
MiB = 1 << 20


@needs_proc
def test_gguf_write_frees_ggmls_copy_of_the_metadata(tmp_path):
    """ggml's gguf context holds a copy of every metadata array while the file is planned;
    writing frees it (gguf_free): eight writes of a 16 MiB array leave resident memory where
    one left it (ggml's copies would add 128 MiB)."""
    big = np.arange(4 * MiB, dtype=np.float32)
    path = tmp_path / "big.gguf"
    gg.gguf.write(path, {"big": big})
    before = _rss()
    for _ in range(8):
        gg.gguf.write(path, {"big": big})
    assert _rss() - before < 48 * MiB


@needs_proc
def test_gradients_free_their_graph_memory(cpu):
    """opt.gradients places the backward graph with an allocator of its own and frees it
    (ggml_gallocr_free): ten calls over a 4 MiB parameter leave resident memory where one
    left it (the allocators' buffers would add over 100 MiB)."""
    with cpu.backend() as cpu_backend, gg.Context() as ctx:
        W = ctx.from_numpy(np.ones((1024, 1024), np.float32))
        ctx.alloc(cpu_backend)
        loss = gg.sum(W * W)
        (dW,) = opt.gradients(loss, [W], cpu_backend)
        assert np.array_equal(dW, np.full((1024, 1024), 2, np.float32))
        before = _rss()
        for _ in range(10):
            opt.gradients(loss, [W], cpu_backend)
        assert _rss() - before < 48 * MiB


def test_optimizer_outputs_need_one_row_per_input_row(cpu):
    with cpu.backend() as be, gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (16, 2), "x")
        x8 = ctx.tensor(gg.f32, (8, 2), "x8")
        w = ctx.tensor(gg.f32, (3, 2), "w")
        ctx.alloc(be)
        w.set(np.ones((3, 2), np.float32))
        with pytest.raises(gg.InvalidArgument, match=r"one row per input row \(16\)"):
            opt.Optimizer(be, x, gg.mul_mat(w, x8), [w])


def test_scheduler_needs_backends(cpu):
    with pytest.raises(gg.InvalidType, match="needs a list of Backend objects"):
        gg.Scheduler([])
    with pytest.raises(gg.InvalidType, match="needs a list of Backend objects"):
        gg.Scheduler([cpu])                     # a Device, not its backend


def test_copy_async_refuses_another_layout(cpu):
    """Same type and shape, other strides: ggml asserts on it (the process would abort)."""
    with cpu.backend() as be, gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 8))
        b = ctx.tensor(gg.f32, (8, 4))
        ctx.alloc(be)
        bt = b.T
        assert bt.shape == a.shape and bt.type == a.type
        with pytest.raises(gg.InvalidArgument, match="layouts differ"):
            gg.copy_async(a, bt, be, be)


def test_conv_1d_refuses_a_transposed_kernel():
    with gg.Context() as ctx:
        kernel = gg.transpose(ctx.tensor(gg.f32, (2, 3, 4)))          # (2, 4, 3), strided
        assert not kernel.is_contiguous
        with pytest.raises(gg.InvalidArgument, match="kernel must be contiguous"):
            gg.conv_1d(kernel, ctx.tensor(gg.f32, (1, 4, 16)))


def test_matmul_refuses_shapes_not_aligned():
    with gg.Context() as ctx:
        with pytest.raises(gg.InvalidArgument, match=r"not aligned \(3 != 4\)"):
            gg.matmul(ctx.tensor(gg.f32, (2, 3)), ctx.tensor(gg.f32, (4, 5)))


def _conv_1d_ref(k: np.ndarray, x: np.ndarray, stride: int, padding: int,
                 dilation: int) -> np.ndarray:
    """torch's conv1d (cross-correlation) in numpy: k (OC, IC, K), x (N, IC, L)."""
    oc, _, kk = k.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding)))
    out_len = (xp.shape[2] - dilation * (kk - 1) - 1) // stride + 1
    out = np.zeros((x.shape[0], oc, out_len), np.float64)
    for j in range(out_len):
        window = xp[:, :, j * stride: j * stride + dilation * (kk - 1) + 1: dilation]
        out[:, :, j] = np.einsum("nik,oik->no", window, k)
    return out


def test_conv_1d_padding_and_dilation_are_where_torch_puts_them(cpu, rng):
    k = rng.standard_normal((2, 3, 3)).astype(np.float32)
    x = rng.standard_normal((1, 3, 12)).astype(np.float32)
    with cpu.backend() as be, gg.Context() as ctx:
        tk, tx = ctx.from_numpy(k), ctx.from_numpy(x)
        ctx.alloc(be)
        y = gg.conv_1d(tk, tx, stride=1, padding=1, dilation=2)
        be.compute(gg.Graph(y))
        want = _conv_1d_ref(k, x, 1, 1, 2)
        assert y.shape == want.shape == (1, 2, 10)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-2, atol=1e-2)


def test_argmax_refuses_a_view_of_every_other_row():
    """Rows contiguous, the matrix not (CUDA's argmax asserts contiguity; the rule is the same
    on every device)."""
    with gg.Context() as ctx:
        v = gg.view(ctx.tensor(gg.f32, (8, 8)), (4, 8), 0, (64, 4))     # rows 0, 2, 4, 6
        assert not v.is_contiguous
        with pytest.raises(gg.InvalidArgument, match="must be contiguous"):
            gg.argmax(v)


@pytest.mark.parametrize("widths", [[(0, -1), (0, 0)], [(-2, 0), (0, 0)], [(1, 2, 3), (0, 0)]])
def test_pad_takes_non_negative_pairs(widths):
    with gg.Context() as ctx:
        with pytest.raises(gg.InvalidArgument, match="non-negative"):
            gg.pad(ctx.tensor(gg.f32, (4, 8)), widths)


def test_pad_takes_one_width_per_axis():
    with gg.Context() as ctx:
        with pytest.raises(gg.InvalidArgument, match="1 widths for 2 axes"):
            gg.pad(ctx.tensor(gg.f32, (4, 8)), [(0, 2)])
