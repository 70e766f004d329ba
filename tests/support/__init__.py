"""The suite's helpers, imported by tests as ``from support import ...`` (fixtures stay in the
conftest.py files; tests/README.md says where each kind of test lives).

Modules beside this one: ``sentinel`` (destinations unlike the expected bytes), ``corpus``
(the bad-input corpus, also run as a script), ``generated`` (the hypothesis generator, also a
script), ``meta_models`` and ``meta_probe`` (the meta device's models and split probe)."""
import ctypes
import os
from pathlib import Path

import numpy as np
import pytest

import ggml_py as gg

ROOT = Path(__file__).resolve().parents[2]       # the checkout
SUPPORT = Path(__file__).resolve().parent        # this folder (scripts run from here)

N_RPC = 2          # the session's RPC servers (fixture rpc_servers)
RPC_IDS = [f"RPC{i}" for i in range(N_RPC)]       # their names in test ids
LOCAL_NAMES = [d.name for d in gg.devices()]      # CPU, and CUDA/Metal/Vulkan where built
DEVICE_NAMES = LOCAL_NAMES + RPC_IDS

# what pip and build_ggml.py say when the package index cannot be reached
_NO_INDEX = ("from the package index", "No matching distribution found",
             "Could not find a version that satisfies")


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python process: this checkout first on PYTHONPATH, the
    parent's entries kept (on a machine whose packages come through PYTHONPATH, such as the
    GPU machine's carried wheels, a child without them cannot import cffi), then `extra`."""
    path = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), **extra)


def device_of(name, rpc_servers):
    """The device a test id names: RPC0/RPC1 are the session's servers' devices (named so by
    ggml from 0.10; 0.9.x names them "RPC[host:port]"), any other name is ggml's."""
    if name in RPC_IDS:
        return rpc_servers[RPC_IDS.index(name)].device
    return gg.device(name)


def producer_rows(dev) -> int:
    """Rows of 1024 f32 for the event-ordering tests' producer chain: on a real GPU enough that
    the chain runs for milliseconds, far longer than Python takes to queue the consumer (an
    H200 finished the small chain before the copy was queued, so a missing record or wait went
    unnoticed); software devices (lavapipe) keep it small: their one in-order queue orders
    everything anyway."""
    soft = any(s in dev.description.lower() for s in ("llvmpipe", "lavapipe", "swiftshader"))
    return 256 if soft or dev.type == "cpu" else 16384


N_ADDS = 200          # LongWriter's graph: N_ADDS adds of producer_rows(dev) x 1024 f32


class LongWriter:
    """`out` = a + a + ... (`n_adds` adds) on `backend`, integers so the sums are exact."""

    def __init__(self, dev, backend, ctx, rng, n_adds=N_ADDS):
        rows = producer_rows(dev)
        self.x = rng.integers(-8, 8, (rows, 1024)).astype(np.float32)
        self.expected = self.x * (n_adds + 1)
        self.sentinel = np.full(self.x.shape, np.nan, np.float32)
        a = ctx.from_numpy(self.x)
        self.out = ctx.tensor(gg.f32, self.x.shape)
        ctx.alloc(backend)
        chain = a
        for _ in range(n_adds):
            chain = chain + a
        self.graph = gg.Graph(gg.cpy(chain, self.out))
        backend.compute(self.graph)              # warm-up: kernels compiled, buffers placed
        backend.set(self.out, self.sentinel)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks",
                                                "keepcost")]


def malloc_in_use() -> int | None:
    """Bytes malloc has handed out and not had back (glibc's mallinfo2: heap chunks in use
    plus mmapped chunks, every arena), or None without glibc 2.33+."""
    try:
        f = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    f.restype = _MallInfo2
    m = f()
    return m.uordblks + m.hblkhd


def vocab_archive() -> Path | None:
    from ggml_build import pins
    return pins.vocab_sdist()


def skip_without_index(output: str, what: str) -> None:
    """Skip, saying so, when `output` shows that the package index could not be reached (the
    GPU machine has none); on machines with an index the test runs and asserts as usual."""
    for line in output.splitlines():
        if any(s in line for s in _NO_INDEX):
            pytest.skip(f"{what} needs the package index, which this machine cannot reach: "
                        f"{line.strip()[:200]}")


RELEASE = tuple(int(p) for p in gg.ggml_version().split(".")[:3] if p.isdigit())


def needs_release(release: str, feature: str):
    """Mark a test of `feature`, which ggml `release` added: older builds skip it, saying so."""
    want = tuple(int(p) for p in release.split("."))
    return pytest.mark.skipif(RELEASE < want, reason=f"{feature} arrived in ggml {release} "
                                                     f"(this build is {gg.ggml_version()})")


def nmse(got, ref) -> float:
    """test-backend-ops' metric: sum((a-b)^2) / sum(a^2)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = np.sum(ref * ref)
    return float(np.sum((got - ref) ** 2) / (den if den else 1.0))


class LayerStack:
    """tanh(x @ W_i) layers with layer i's weights in a buffer of ``weight_backends[i]`` and
    the input on ``input_backend``: a graph a scheduler splits where the weights live.
    ``ref`` is numpy's result; ``close()`` frees the contexts (not the backends)."""

    def __init__(self, weight_backends, input_backend, rng, rows=8, width=32):
        self.x = rng.standard_normal((rows, width)).astype(np.float32)
        self.w = [(rng.standard_normal((width, width)) / 6).astype(np.float32)
                  for _ in weight_backends]
        self.ref = self.x
        for wi in self.w:
            self.ref = np.tanh(self.ref @ wi)
        self.ctxs = [gg.Context() for _ in weight_backends] + [gg.Context()]
        ws = [c.from_numpy(wi) for c, wi in zip(self.ctxs, self.w)]
        xin = self.ctxs[-1].from_numpy(self.x)
        for c, b in zip(self.ctxs, list(weight_backends) + [input_backend]):
            c.alloc(b)
        for t, wi in zip(ws, self.w):
            t.set(wi)
        xin.set(self.x)
        h = xin
        for t in ws:
            h = gg.tanh(h @ t)
        self.out = h

    def close(self):
        for c in self.ctxs:
            c.close()
