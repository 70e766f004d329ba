"""Tests written against the survivors of the seed-66 mutation sample (docs/mutation.md,
round 7): each fails when its mutant (tools/must_kill.txt) is applied and passes without."""
import gc
import os

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import opt
from support.meta_models import meta_supported


@pytest.mark.parametrize("bad", [[], (), "t", None, [1], 5])
def test_a_graph_is_made_of_tensors(bad):
    with pytest.raises(gg.InvalidType, match="Graph: needs a Tensor or a non-empty list"):
        gg.Graph(bad)


@pytest.mark.parametrize("bad", [True, 64.0, "64", None])
def test_buffer_type_alloc_takes_an_int(cpu, bad):
    """A bool is an int to Python (True would allocate one byte); a float, a str are refused
    with the type named."""
    with pytest.raises(gg.InvalidType, match=f"nbytes must be an int, not {type(bad).__name__}"):
        cpu.buffer_type.alloc(bad)
    with cpu.buffer_type.alloc(np.int64(64)) as buf:
        assert buf.size >= 64


def _vm_size() -> int:
    """This process's virtual memory size in bytes (Linux): a freed large chunk is unmapped at
    once, whether or not its pages were ever touched."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc (Linux)")
def test_closed_contexts_free_their_metadata_beyond_the_pool():
    """With no pool for reuse, a closed context's metadata chunk (35 MiB at capacity 100,000)
    goes back to the system: eight of them must not add 280 MiB."""
    old = gg.Context.pool_limit(0)
    try:
        before = _vm_size()
        for _ in range(8):
            ctx = gg.Context(capacity=100_000)
            ctx.tensor(gg.f32, (4,))
            ctx.close()
        gc.collect()
        assert _vm_size() - before < 120 * 2 ** 20
    finally:
        gg.Context.pool_limit(old)


@pytest.mark.parametrize("bad", [[], [-1], [1.5], [True], "ab", 3])
def test_split_sizes_are_a_list_of_ints(bad):
    with pytest.raises(gg.InvalidType, match="Split: sizes must be a non-empty list of ints"):
        gg.Split(axis=0, sizes=bad)
    with pytest.raises(gg.InvalidType, match="Split: segments must be a non-empty list of ints"):
        gg.Split(axis=0, segments=bad)


def test_a_negative_offset_is_refused(cpu):
    with cpu.backend() as be, gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (8,))
        ctx.alloc(be)
        t.set(np.zeros(8, np.float32))
        with pytest.raises(gg.InvalidArgument, match="offset must be >= 0, got -4"):
            t.set(np.ones(1, np.float32), offset=-4, flat=True)
        np.testing.assert_array_equal(t.numpy(), np.zeros(8, np.float32))


def test_numpy_without_a_copy_is_refused_where_a_copy_is_needed(rpc_devs, cpu):
    with rpc_devs[0].backend() as rb, cpu.backend() as be, gg.Context() as cr, \
            gg.Context() as cq:
        r = cr.tensor(gg.f32, (4,))                 # memory on an RPC server
        cr.alloc(rb)
        r.set(np.arange(4, dtype=np.float32))
        q = cq.tensor(gg.q8_0, (32,))               # no numpy dtype: dequantized
        cq.alloc(be)
        q.set(np.zeros(q.nbytes, np.uint8), flat=True)
        for t in (r, q):
            with pytest.raises(gg.InvalidArgument, match="not plain host memory; a copy is needed"):
                t.numpy(copy=False)
        np.testing.assert_array_equal(r.numpy(), np.arange(4, dtype=np.float32))


def test_copies_take_tensors(cpu):
    with cpu.backend() as be, gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (4,))
        ctx.alloc(be)
        for bad in (np.zeros(4, np.float32), "t", None):
            with pytest.raises(gg.InvalidType, match="copy: src must be a Tensor, not"):
                gg.copy(bad, t)
            with pytest.raises(gg.InvalidType, match="copy: dst must be a Tensor, not"):
                gg.copy(t, bad)


@pytest.mark.skipif(not meta_supported(), reason="ggml_py offers meta devices from ggml 0.26.0")
def test_the_optimizer_refuses_a_meta_backend(rpc_servers):
    """ggml's meta backend asserts that a graph has no gradients (the process would abort)."""
    md = gg.meta_device([s.device for s in rpc_servers], {})
    with md.backend() as be, gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (8, 4), "x")
        w = ctx.tensor(gg.f32, (3, 4), "w")
        ctx.alloc(be)
        w.set(np.ones((3, 4), np.float32))
        with pytest.raises(gg.UnsupportedError, match="computes no backward graphs"):
            opt.Optimizer(be, x, gg.mul_mat(w, x), [w])


@pytest.mark.skipif(not meta_supported(), reason="ggml_py offers meta devices from ggml 0.26.0")
def test_a_view_of_a_permuted_split_tensor_is_refused(rpc_servers, rng):
    """ggml's meta backend aborts on it ('view of permuted tensor not implemented',
    ggml-backend-meta.cpp): the plan refuses it first, even where the view itself is plain."""
    from support.meta_models import run
    parts = [s.device for s in rpc_servers]
    w = {"w": rng.standard_normal((6, 8)).astype(np.float32),
         "x": rng.standard_normal((4, 8)).astype(np.float32)}
    md = gg.meta_device(parts, {"w": gg.Split(axis=0)})

    def build(t):
        p = gg.permute(gg.mul_mat(t["w"], t["x"]), (1, 0))     # (6, 4), permuted, split
        return gg.cont(gg.view(p, (4, 6), 0, (24, 4)))          # a plain layout over it
    with md.backend() as be:
        with pytest.raises(gg.InvalidArgument, match="views a permuted split tensor"):
            run(be, w, build)


def test_set_rows_needs_rows_in_a_row(cpu):
    with gg.Context() as ctx:
        dst = gg.permute(ctx.tensor(gg.f32, (4, 8)), (1, 0))      # (8, 4), rows strided
        src = ctx.tensor(gg.f32, (2, 4))
        idx = ctx.tensor(gg.i32, (2,))
        with pytest.raises(gg.InvalidArgument, match="set_rows: dst rows must be contiguous"):
            gg.set_rows(dst, src, idx)
        assert gg.set_rows(gg.cont(dst), src, idx).shape == (8, 4)


def test_im2col_needs_rows_in_a_row():
    with gg.Context() as ctx:
        k = ctx.tensor(gg.f32, (2, 3, 3, 3))
        data = gg.permute(ctx.tensor(gg.f32, (1, 3, 8, 8)), (0, 1, 3, 2))
        with pytest.raises(gg.InvalidArgument, match=r"im2col: the rows of data .* are strided"):
            gg.im2col(k, data, 1, 0, 1, True)


@pytest.mark.parametrize("name", ["iq3_s"])
def test_quantize_to_a_type_with_lookup_tables(name, rng):
    """The i-quants without an importance matrix need ggml_quantize_init's grids (quantize()
    calls it, and ggml_quantize_chunk does too: the seed-66 mutant that skips the first call
    is equivalent); the values come back close through ggml's own to_float."""
    x = rng.standard_normal((2, 256)).astype(np.float32)
    raw, t = gg.quantize(x, name)
    with gg.Context() as ctx:
        q = ctx.tensor(t, (2, 256))
        ctx.alloc(gg.device("CPU").backend())
        q.set(raw, flat=True)
        back = q.numpy()
    assert np.mean((back - x) ** 2) / np.mean(x ** 2) < 0.1
