"""Tests written against survivors of the census (docs/mutation.md, round 9): the scheduler
picture's copies on an RPC device whose ggml name differs from ggml_py's, host memory in a
copy queued on another device's backend, and a cleared buffer's record outliving it. Each
fails when its mutant (tools/must_kill.txt) is applied and passes without."""
import gc
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import _display as D
from ggml_py._loader import cstr, ffi, lib
from support import LayerStack, child_env, malloc_in_use, needs_release


@needs_release("0.23.0", "an RPC server that survives this graph (0.20.2's aborts)")
def test_the_picture_knows_copies_named_after_ggmls_rpc_backend_name(rpc_devs, rng):
    """ggml names the backend of the second server's device "RPC0[host:port]" (its index on
    its server) while ggml_py names it after the device ("RPC1[host:port]"); the scheduler
    names its copies after ggml's name. The picture still shows them as copies."""
    backends = [d.backend() for d in rpc_devs]
    differ = [b for b in backends if cstr(lib.ggml_backend_name(b.ptr)) != b.name]
    if not differ:
        pytest.skip("every RPC backend's ggml name is ggml_py's here")
    cpu_be = gg.device("CPU").backend()
    stack = LayerStack(differ[:1], cpu_be, rng)
    with gg.Scheduler([differ[0], cpu_be]) as sched:
        g = gg.Graph(stack.out)
        sched.compute(g)
        assert sched.n_tensor_copies > 0
        svg = D.graph_svg(g, scheduler=sched)
    assert "copy of " in svg, svg        # the input, copied to the RPC backend
    stack.close()
    cpu_be.close()
    for b in backends:
        b.close()


def test_host_memory_may_be_copied_on_another_devices_backend(rpc_devs):
    """Every backend's copy path reads host memory: a CPU tensor is a valid source of a copy
    queued on an RPC backend."""
    x = np.arange(6, dtype=np.float32)
    with rpc_devs[0].backend() as rb, gg.device("CPU").backend() as cb, \
            gg.Context() as hc, gg.Context() as rc:
        src, dst = hc.tensor(gg.f32, (6,)), rc.tensor(gg.f32, (6,))
        hc.alloc(cb)
        rc.alloc(rb)
        src.set(x)
        dst.set(-x - 1)
        gg.copy_async(src, dst, rb, rb)
        rb.synchronize()
        np.testing.assert_array_equal(dst.numpy(), x)


def _addr(buf):
    return int(ffi.cast("uintptr_t", buf.ptr))


def test_a_cleared_buffer_does_not_vouch_for_the_next_one_at_its_address(cpu):
    """Buffer.clear records the buffer's address AND its memory's base address: a buffer freed
    and another made at the same address (malloc reuses it) with other memory must not read
    as cleared (its tensors hold nothing)."""
    with cpu.backend() as be:
        seen = 0
        for n in range(1, 200):
            with gg.Context() as c1:
                c1.tensor(gg.f32, (n,))
                (b1,) = c1.alloc(be)
                b1.clear(0)
                addr, base = _addr(b1), b1.base
            with gg.Context() as c2:
                t = c2.tensor(gg.f32, (4096 + 64 * n,))     # another size: other memory
                (b2,) = c2.alloc(be)
                if _addr(b2) != addr or b2.base == base:
                    continue
                seen += 1
                with pytest.raises(gg.UnwrittenError):
                    t.numpy()
            if seen >= 3:
                break
        if not seen:    # (glibc reuses it at once; another allocator may not: nothing seen)
            pytest.skip("malloc never gave the freed buffer's address to the next buffer")


def test_a_release_without_ggml_opt_refuses_training_by_name(monkeypatch):
    """Every pinned release has ggml-opt; a build without it (a source tree, a trimmed build)
    refuses datasets and optimizers by name rather than calling symbols it lacks. The feature
    flag is what such a build sets (ggml_py._features.OPT: `ggml_opt_init` is absent)."""
    from ggml_py import _features, opt
    monkeypatch.setattr(_features, "OPT", False)
    for make in (lambda: opt.Dataset(np.zeros((4, 2), np.float32)),
                 lambda: opt.Optimizer(None, None, None, [])):
        with pytest.raises(gg.UnsupportedError, match="this ggml release has no ggml-opt"):
            make()


def test_type_traits_are_ggmls():
    """The type table is made once, at import, from ggml's own answers (ggml_blck_size,
    ggml_type_size, ggml_is_quantized): a mutant there needs a fresh process, which
    tools/mutants.py gives every function that runs while the package loads."""
    assert (gg.q4_0.block_size, gg.q4_0.type_size, gg.q4_0.is_quantized) == (32, 18, True)
    assert (gg.q8_0.block_size, gg.q8_0.type_size, gg.q8_0.is_quantized) == (32, 34, True)
    assert (gg.f16.block_size, gg.f16.type_size, gg.f16.is_quantized) == (1, 2, False)
    assert (gg.f32.block_size, gg.f32.type_size, gg.f32.is_quantized) == (1, 4, False)


def test_connect_returns_the_rpc_registry(rpc_servers):
    """What rpc.connect returns is ggml's RPC registry, on every release (0.9.x makes one
    device per endpoint with ggml_backend_rpc_add_device; its registry is that device's)."""
    reg = gg.rpc.connect(rpc_servers[0].endpoint)
    assert reg.name.startswith("RPC")        # ("RPC[host:port]" since the registry per server)
    assert all(d.registry.name.startswith("RPC") for d in reg.devices)
    assert reg.devices[0].name == rpc_servers[0].device.name


@pytest.mark.skipif(malloc_in_use() is None, reason="needs glibc's mallinfo2")
def test_lowering_the_pool_limit_frees_the_pooled_chunks():
    """Closed contexts leave their metadata chunks in a pool for reuse; pool_limit(0) frees
    them (ggml_free): malloc's bytes in use fall by at least the pooled bytes' nine tenths."""
    from ggml_py import _record_pool
    old = gg.Context.pool_limit(256 << 20)
    try:
        for c in [gg.Context(capacity=4096) for _ in range(8)]:    # ~1.5 MB of records each
            c.close()
        held = _record_pool.pooled()
        assert held >= 4 << 20, held
        gc.collect()
        before = malloc_in_use()
        gg.Context.pool_limit(0)
        assert _record_pool.pooled() == 0
        freed = before - malloc_in_use()
        assert freed >= 0.9 * held, (freed, held)
    finally:
        gg.Context.pool_limit(old)


def test_allocating_on_a_dead_servers_buffer_type_raises():
    """BufferType.alloc asks that the type's device is alive first: ggml's RPC client aborts
    the process when the server is gone ("Remote RPC server crashed"). In a child process:
    the server is killed between taking its buffer type and allocating."""
    code = textwrap.dedent("""
        import ggml_py as gg
        s = gg.rpc.serve(); bt = gg.rpc.connect(s.endpoint).devices[0].buffer_type
        s.kill()
        try:
            bt.alloc(16)
        except gg.RPCError as e:
            print("refused:", str(e)[:60])
    """)
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "refused: the RPC server at" in r.stdout, (r.returncode,
                                                                           r.stderr[-500:])


def test_closing_waits_for_a_builder_holding_the_contexts_c_lock():
    """A checked op builds holding its context's C lock (helpers.c), in any thread; close()
    takes that lock before it tells the C state to refuse, so it waits for a builder in the
    middle of building. Deterministic: this test holds the lock as such a builder would."""
    from ggml_py._context_records import C_LOCK, C_UNLOCK
    ctx = gg.Context()
    st = ctx.checked_state
    if st is None or C_LOCK is None:
        pytest.skip("this build has no checked ops (helpers.c)")
    C_LOCK(st)
    closed = threading.Event()
    th = threading.Thread(target=lambda: (ctx.close(), closed.set()))
    th.start()
    try:
        waited = not closed.wait(0.5)
    finally:
        C_UNLOCK(st)
    th.join(30)
    assert waited, "close() went on while a builder held the context's C lock"
    assert closed.is_set() and ctx.closed


def test_ggmls_lines_after_the_exit_handlers_go_to_its_own_printer():
    """At exit ggml_py hands ggml's log back to ggml's own printer (stderr): a line ggml
    writes after the exit handlers ran (a later handler, an object freed at shutdown) must not
    go through Python's logging, which is being torn down. In a child whose own exit handler,
    registered before ggml_py's and so run after it, makes ggml log an error while Python's
    "ggml" logger is silenced: the line appears on stderr all the same."""
    code = textwrap.dedent("""
        import atexit, logging

        def late():
            try:
                gg.device("CPU").buffer_type.alloc(1 << 50)
            except gg.OutOfMemory:
                print("refused", flush=True)

        atexit.register(late)               # first registered: run last
        import ggml_py as gg
        logging.getLogger("ggml").disabled = True
        gg.device("CPU")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "refused" in r.stdout, r.stderr[-800:]
    assert "insufficient memory" in r.stderr or "failed to allocate" in r.stderr, r.stderr
