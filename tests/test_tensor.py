"""Tensors and contexts: data in and out, quantized values, growing contexts, numpy-semantics
operators with Python scalars, lifetimes across contexts, copies refused."""
import numpy as np
import pytest

import ggml_py as gg
from conftest import nmse


def test_quantized_roundtrip(cpu):
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    with cpu.backend() as be, gg.Context() as ctx:
        q = ctx.tensor(gg.q8_0, x.shape)
        ctx.alloc(be)
        q.set(x)                      # quantized on the way in with ggml_quantize_chunk
        assert nmse(q.numpy(), x) < 1e-3
        raw, t = gg.quantize(x, gg.q4_0)
        assert t is gg.q4_0 and raw.nbytes == 4 * gg.q4_0.row_size(64)


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

