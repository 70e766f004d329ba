"""Buffer types and buffers, zero-copy host buffers."""
import numpy as np
import pytest

import ggml_py as gg


def test_buffer_type_properties(dev):
    b = dev.buffer_type
    assert b.name and b.alignment > 0 and b.max_size > 0
    assert b.device == (None if dev.type == "cpu" else dev)
    assert b.is_host == (dev.type == "cpu")


def test_alloc_clear_close(dev):
    with dev.buffer_type.alloc(4096) as buf:
        assert buf.size >= 4096 and buf.buffer_type == dev.buffer_type
        assert buf.is_host == dev.buffer_type.is_host
        buf.clear(7)
        buf.usage = "weights"
        assert buf.usage == "weights"
    assert buf.closed
    buf.close()  # idempotent


def test_clear_fills_bytes(dev):
    with gg.Context() as ctx, dev.backend() as be:
        t = ctx.tensor(gg.i8, (64,))
        (buf,) = ctx.alloc(be)
        buf.clear(3)
        assert (t.numpy() == 3).all()


def test_alloc_size_of_tensor(cpu):
    with gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (10, 10))
        assert cpu.buffer_type.alloc_size(t) >= 400


def test_buffer_from_host_is_zero_copy(cpu):
    a = gg.aligned_empty((256,), np.float32)
    a[:] = np.arange(256)
    buf = cpu.buffer_from_host(a)
    assert buf.base == a.ctypes.data and buf.size == a.nbytes and buf.is_host
    del a
    import gc; gc.collect()
    # the buffer keeps the array alive: its memory still holds the values
    view = np.frombuffer(gg.ffi.buffer(gg.ffi.cast("void *", buf.base), buf.size), np.float32)
    assert view[255] == 255
    buf.close()


def test_buffer_from_host_refuses_where_unsupported(rpc_devs):
    with pytest.raises(gg.UnsupportedError, match="cannot make buffers from host memory"):
        rpc_devs[0].buffer_from_host(gg.aligned_empty((16,)))
