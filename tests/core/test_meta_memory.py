"""A meta device's memory is read through its buffer, never at its tensors' addresses.

ggml says a meta device's buffer is host memory (its parts' are), while its tensors' ``data``
is a placeholder address. Every reader that trusted ``buffer_is_host`` (a numpy view, ggml's
own copy of a host source, a DLPack export) read that address and killed the process. One rule
(``_buffer.host_addressable``) now decides for all of them; each reader here must give the
values, or refuse, and the process must live."""
import numpy as np
import pytest

import ggml_py as gg
from support.meta_models import meta_supported

pytestmark = pytest.mark.skipif(not meta_supported(),
                                reason="ggml_py offers meta devices from ggml 0.26.0")

X = np.arange(32, dtype=np.float32).reshape(8, 4)


@pytest.fixture
def meta_and_host(cpu):
    """m: an (8, 4) f32 tensor of a meta device over two CPU parts, split by rows, holding X;
    h: a CPU tensor of the same shape, holding NaN (a destination unlike X)."""
    md = gg.meta_device([cpu, cpu], {"m": gg.Split(axis=0), "m2": gg.Split(axis=1)})
    with md.backend() as mb, cpu.backend(n_threads=1) as cb, gg.Context() as mc, \
            gg.Context() as hc:
        m = mc.tensor(gg.f32, (8, 4), "m")
        m2 = mc.tensor(gg.f32, (8, 4), "m2")
        mc.alloc(mb)
        h = hc.tensor(gg.f32, (8, 4), "h")
        hc.alloc(cb)
        m.set(X)
        m2.set(np.full_like(X, np.nan))
        h.set(np.full_like(X, np.nan))
        yield m, m2, h, cb


def test_meta_memory_is_not_host_memory_to_ggml_py(meta_and_host):
    m, _, h, _ = meta_and_host
    assert not m.is_host and not m.buffer.is_host  # not readable at its address
    assert not m.buffer.buffer_type.is_host
    assert h.is_host and h.buffer.is_host


READERS = {
    "numpy()": lambda m, m2, h, be: m.numpy(),
    "numpy(copy=True)": lambda m, m2, h, be: m.numpy(copy=True),
    "copy to host": lambda m, m2, h, be: (gg.copy(m, h), h.numpy())[1],
    "copy_async to host": lambda m, m2, h, be: (gg.copy_async(m, h, be, be), be.synchronize(),
                                                h.numpy())[2],
    "copy to meta": lambda m, m2, h, be: (gg.copy(m, m2), m2.numpy())[1],
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_of_meta_memory_gets_the_values(meta_and_host, reader):
    m, m2, h, be = meta_and_host
    got = READERS[reader](m, m2, h, be)
    np.testing.assert_array_equal(got, X)


def test_a_gguf_file_loads_onto_a_meta_device(cpu, tmp_path):
    """A load reads the file straight into host memory of the device's own buffer type; a
    meta device's goes through its buffer (a read at the placeholder failed: EFAULT)."""
    path = tmp_path / "w.gguf"
    gg.gguf.write(path, tensors={"w": X})
    md = gg.meta_device([cpu, cpu], {"w": gg.Split(axis=0)})
    with md.backend() as mb:
        with gg.gguf.read(path) as f:
            tensors = f.load(mb)
        np.testing.assert_array_equal(tensors["w"].numpy(), X)


def test_a_view_of_meta_memory_is_refused_not_faked(meta_and_host):
    m, _, _, _ = meta_and_host
    with pytest.raises(gg.InvalidArgument, match="numpy\\(copy=False\\): this tensor is not "
                                                 "plain host memory"):
        m.numpy(copy=False)
    with pytest.raises((gg.GGMLError, BufferError, TypeError)):
        np.from_dlpack(m)
    assert "m" in m._repr_html_()                  # a notebook's display reads it safely
