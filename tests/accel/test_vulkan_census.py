"""Tests written against census mutants seen only on Vulkan (docs/mutation.md, round 9):
Buffer.clear's Vulkan path, which writes the bytes through a scratch tensor because
ggml-vulkan hands the byte to vkCmdFillBuffer as a 32-bit word. They skip without a Vulkan
device (CI runs them on Mesa's lavapipe, in its Vulkan step)."""
import gc

import numpy as np
import pytest

import ggml_py as gg
from ggml_py._loader import lib
from support import malloc_in_use

VULKAN = [d.name for d in gg.devices() if d.registry.name == "Vulkan"]
pytestmark = pytest.mark.skipif(not VULKAN, reason="needs a Vulkan build and device")


@pytest.fixture(params=VULKAN[:1] or ["none"])
def vulkan_buffer(request):
    """(an f32 tensor, its buffer) on the first Vulkan device (its name in the test id: CI's
    Vulkan step selects -k Vulkan0)."""
    with gg.device(request.param).backend() as be, gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (256,))
        (buf,) = ctx.alloc(be)
        yield t, buf


def test_clear_sets_every_byte_on_vulkan(vulkan_buffer):
    t, buf = vulkan_buffer
    t.set(np.zeros(256, np.float32))
    buf.clear(7)
    got = t.numpy(copy=True).view(np.uint8)
    assert (got == 7).all(), np.unique(got)


@pytest.mark.skipif(malloc_in_use() is None, reason="needs glibc's mallinfo2")
def test_clearing_on_vulkan_frees_its_scratch_context(vulkan_buffer):
    """Each Vulkan clear places a tensor over the buffer in a small ggml context, freed after:
    2,000 clears must not keep 2,000 of them (malloc's bytes in use)."""
    _, buf = vulkan_buffer
    buf.clear(7)
    gc.collect()
    before = malloc_in_use()
    for _ in range(2000):
        buf.clear(7)
    gc.collect()
    grown = malloc_in_use() - before
    assert grown < 2000 * int(lib.ggml_tensor_overhead()), grown
