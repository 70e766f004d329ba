"""DLPack both ways, without copies: numpy everywhere, torch where it is installed (CPU and,
on the GPU machine, CUDA)."""
import numpy as np
import pytest

import ggml_py as gg
from support.sentinel import assert_bytes, unlike


def _host_tensor(be, ctx, x):
    """A tensor of `be` holding x, set after it started as unlike(x) (every byte different):
    what an export then shows came through the set."""
    t = ctx.from_numpy(unlike(x))
    ctx.alloc(be)
    t.set(x)
    assert_bytes(t.numpy(copy=True), x, unlike(x))
    return t


def test_numpy_shares_a_host_tensors_memory(cpu):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with cpu.backend() as be, gg.Context() as ctx:
        t = _host_tensor(be, ctx, x)
        assert t.__dlpack_device__() == (1, 0)
        y = np.from_dlpack(t)
        assert y.ctypes.data == t.data and np.array_equal(y, x)
        y[1, 2] = -5                                  # one memory: the write shows in ggml
        assert t.numpy(copy=True)[1, 2] == -5


def test_strided_views_keep_their_strides(cpu):
    x = np.arange(24, dtype=np.int32).reshape(4, 6)
    with cpu.backend() as be, gg.Context() as ctx:
        t = _host_tensor(be, ctx, x)
        assert np.array_equal(np.from_dlpack(t.T), x.T)   # a view, strides and all


def test_exported_memory_outlives_the_python_tensor(cpu):
    x = np.arange(8, dtype=np.float32)
    with cpu.backend() as be:
        ctx = gg.Context()
        y = np.from_dlpack(_host_tensor(be, ctx, x))
        del ctx                                       # the capsule keeps the context alive
        import gc
        gc.collect()
        assert np.array_equal(y, x)


def test_device_memory_others_cannot_address_raises_buffererror(rpc_devs):
    with rpc_devs[0].backend() as be, gg.Context() as ctx:
        t = _host_tensor(be, ctx, np.ones(4, np.float32))
        with pytest.raises(BufferError, match="t.numpy"):
            np.from_dlpack(t)
        assert np.array_equal(t.numpy(), np.ones(4, np.float32))


def test_quantized_tensors_are_refused(cpu):
    with cpu.backend() as be, gg.Context() as ctx:
        q = ctx.tensor(gg.q8_0, (2, 32))
        ctx.alloc(be)
        with pytest.raises(BufferError, match="dequantize"):
            np.from_dlpack(q)


def test_from_dlpack_wraps_host_memory_without_a_copy(cpu):
    x = gg.aligned_empty((4, 8), np.float32)
    x[...] = np.arange(32, dtype=np.float32).reshape(4, 8)
    with cpu.backend() as be, gg.Context() as ctx:
        t = gg.from_dlpack(x, ctx, "x")
        assert t.data == x.ctypes.data and t.shape == (4, 8) and t.name == "x"
        out = t * 2.0
        be.compute(gg.Graph(out))
        assert np.array_equal(out.numpy(), x * 2)
        x[0, 0] = 100                                 # the same memory
        assert t.numpy()[0, 0] == 100


def test_from_dlpack_refuses_what_it_cannot_wrap(cpu):
    with gg.Context() as ctx:
        with pytest.raises(gg.InvalidArgument, match="aligned"):
            gg.from_dlpack(gg.aligned_empty(9, np.float32)[1:], ctx)
        with pytest.raises(gg.InvalidArgument, match="contiguous"):
            gg.from_dlpack(gg.aligned_empty((4, 8), np.float32)[:, ::2], ctx)


def _torch():
    return pytest.importorskip("torch")


def test_torch_cpu_both_ways(cpu):
    torch = _torch()
    with cpu.backend() as be, gg.Context() as ctx:
        t = _host_tensor(be, ctx, np.arange(6, dtype=np.float32))
        tt = torch.from_dlpack(t)
        assert tt.data_ptr() == t.data
        tt.mul_(3)
        assert np.array_equal(t.numpy(), np.arange(6) * 3)
        src = torch.from_numpy(gg.aligned_empty(16, np.float32))
        w = gg.from_dlpack(src, ctx)
        assert w.data == src.data_ptr()


def _cuda_devices():
    return [d for d in gg.devices() if d.name.startswith("CUDA")]


@pytest.mark.skipif(not _cuda_devices(), reason="no CUDA device in this build")
def test_torch_views_a_cuda_tensor_without_a_copy():
    torch = _torch()
    dev = gg.device("CUDA0")
    x = np.arange(1024, dtype=np.float32).reshape(32, 32)
    with dev.backend() as be, gg.Context() as ctx:
        t = _host_tensor(be, ctx, x)
        out = t * 2.0
        be.compute(gg.Graph(out))
        assert out.__dlpack_device__() == (2, 0)
        tt = torch.from_dlpack(out)
        assert tt.is_cuda and tt.data_ptr() == out.data
        assert torch.equal(tt.cpu(), torch.from_numpy(x * 2))
        tt.zero_()                                    # torch writes, ggml reads the same bytes
        torch.cuda.synchronize()
        assert not out.numpy().any()
        with pytest.raises(gg.UnsupportedError, match="buffer_from_host_ptr"):
            gg.from_dlpack(torch.ones(4, device="cuda"), ctx)
