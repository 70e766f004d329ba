"""Backends: creation, threads, sync and async set/get."""
import gc
import os
import weakref

import numpy as np

import ggml_py as gg
from support.sentinel import assert_bytes, unlike


def test_backend_basics(dev):
    with dev.backend() as be:
        assert be.device is dev and be.name
        be.synchronize()
    assert be.closed


def usable_cores_here() -> int:
    """The cores this process may use, as the platform tells them: its affinity where the
    platform has one (Linux), the machine's count where it has none (macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def test_cpu_threads_default_to_usable_cores(cpu):
    with cpu.backend() as be:
        assert be.n_threads == usable_cores_here()
        be.n_threads = 1
        assert be.n_threads == 1
    with cpu.backend(n_threads=3) as be:
        assert be.n_threads == 3


def test_cpu_threads_default_without_affinity(cpu, monkeypatch):
    """macOS' os module has no sched_getaffinity (issue 33): with it removed, the default
    is the machine's core count, and nothing raises AttributeError."""
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert usable_cores_here() == (os.cpu_count() or 1)
    with cpu.backend() as be:
        assert be.n_threads == usable_cores_here()


BAD_THREADS = [0, -1, True, 1.5, 10 ** 6]     # (10 ** 6: above any GGML_MAX_N_THREADS)


def test_every_thread_count_goes_through_one_rule(cpu, monkeypatch, capsys):
    """Each public entry point that takes a thread count (Device.backend, Backend.n_threads,
    rpc.serve, the rpc-server's --threads) refuses a bad one through _backend.check_n_threads,
    with its message: an entry point that checks on its own, or not at all, fails here."""
    import pytest
    from ggml_py import _backend, _rpc_server
    from ggml_py.errors import InvalidArgument

    rule = _backend.check_n_threads
    seen: list = []

    def spy(n, what="n_threads"):
        seen.append(n)
        return rule(n, what)

    monkeypatch.setattr(_backend, "check_n_threads", spy)

    def message(n, what):
        with pytest.raises(InvalidArgument) as e:
            rule(n, what)
        return str(e.value)

    with cpu.backend(n_threads=1) as be:
        entry_points = [
            ("n_threads", lambda n: cpu.backend(n_threads=n)),
            ("n_threads", lambda n: setattr(be, "n_threads", n)),
            ("serve: threads", lambda n: gg.rpc.serve(threads=n)),
        ]
        for what, call in entry_points:
            for n in BAD_THREADS:
                seen.clear()
                with pytest.raises(InvalidArgument) as e:
                    call(n)
                assert str(e.value) == message(n, what) and seen and seen[0] is n, (what, n)
        assert be.n_threads == 1                      # the refused values changed nothing
        for n in (0, -1, 10 ** 6):                    # (argparse turns away what is no int)
            seen.clear()
            with pytest.raises(SystemExit) as e:
                _rpc_server.main(["--threads", str(n)])
            assert e.value.code == 2 and seen == [n]
            assert message(n, "--threads") in capsys.readouterr().err

    monkeypatch.undo()
    with cpu.backend(n_threads=np.int64(2)) as be:       # a numpy integer passes, as an int
        assert be.n_threads == 2 and type(be.n_threads) is int


def test_set_get_roundtrip(dev, rng):
    x = rng.standard_normal((8, 33)).astype(np.float32)
    with dev.backend() as be, gg.Context() as ctx:
        t = ctx.from_numpy(unlike(x))      # set must change every byte
        ctx.alloc(be)
        be.set(t, x)
        assert_bytes(be.get(t), x, unlike(x))
        out = unlike(x)
        be.get(t, out)
        assert_bytes(out, x, unlike(x))


def test_async_roundtrip_keeps_the_array_alive(dev, rng):
    x = rng.standard_normal(1 << 16).astype(np.float32)
    expect = x.copy()
    with dev.backend() as be, gg.Context() as ctx:
        t = ctx.from_numpy(unlike(x))      # set_async must change every byte
        ctx.alloc(be)
        ref = weakref.ref(x)
        be.set_async(t, x)
        del x
        gc.collect()
        assert ref() is not None          # held by the backend until synchronize
        be.synchronize()
        gc.collect()
        assert ref() is None
        out = unlike(expect)
        be.get_async(t, out)
        be.synchronize()
        assert_bytes(out, expect, unlike(expect))


def test_partial_set_with_offset(cpu):
    with cpu.backend() as be, gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (8,))
        ctx.alloc(be)
        t.set(np.zeros(8, np.float32))
        t.set(np.ones(2, np.float32).view(np.uint8), offset=8, flat=True)
        assert t.numpy().tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
