"""Crash classes of issue 28 (item 3, core package): each case runs in a child process, since
before its fix it killed the process (segfault, GGML_ASSERT, a hang). A case passes when the
child exits 0 after the bad call raised the expected ggml_py error (see docs/validation.md,
"Crash classes of round 3 (core)")."""
from __future__ import annotations

import socket
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

from support import ROOT, child_env

PRELUDE = """
import gc, os, sys
import numpy as np
import ggml_py as gg
from ggml_py import errors
def expect(exc, fn, *words):
    try:
        fn()
    except exc as e:
        msg = str(e)
        assert all(w in msg for w in words), msg
        return
    raise AssertionError(f"no {exc.__name__} raised")
"""


def run_child(code: str, timeout: float = 60) -> None:
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], cwd=ROOT,
                       env=child_env(GGML_NO_BACKTRACE="1"), capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"child exited {p.returncode}:\n{p.stdout}\n{p.stderr[-3000:]}"


# -- opaque-layout buffer types (CPU_REPACK) ------------------------------------------------------

def test_opaque_buffer_types_are_not_allocated_in():
    # before: f32 set segfaulted, an offset write of q4_0 hit GGML_ASSERT(offset == 0), a read
    # segfaulted (get_tensor is NULL); now no tensor of ggml_py gets memory there
    run_child("""
    cpu = gg.device("CPU")
    opaque = [b for b in cpu.buffer_types if not b.holds_plain_bytes]
    assert [b.name for b in opaque] == ["CPU_REPACK"], [b.name for b in cpu.buffer_types]
    assert cpu.buffer_type.holds_plain_bytes
    for buft in opaque:
        for typ, shape in ((gg.f32, (4, 32)), (gg.q4_0, (8, 64)), (gg.i32, (8,))):
            ctx = gg.Context(); t = ctx.tensor(typ, shape)
            expect(errors.UnsupportedError, lambda: ctx.alloc(buft), buft.name, "layout")
            assert not t.is_allocated
        expect(errors.UnsupportedError, lambda: buft.alloc(1 << 16), buft.name)
        buft._repr_html_() if hasattr(buft, "_repr_html_") else repr(buft)
    # a GGUF load into the type takes the same path (Context.alloc)
    import tempfile
    path = os.path.join(tempfile.mkdtemp(), "w.gguf")
    ctx = gg.Context(); w = ctx.from_numpy(np.ones((8, 64), np.float32), name="w")
    ctx.alloc(cpu.backend(1))
    gg.gguf.write(path, {"a": 1}, {"w": w})
    f = gg.gguf.read(path)
    for buft in opaque:
        expect(errors.UnsupportedError, lambda: f.load(buft), buft.name)
    assert f.load(cpu.buffer_type)["w"].numpy().sum() == 512
    """)


# -- borrowed buffers ----------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["context closed", "buffer closed", "scheduler reset"])
def test_borrowed_buffer_after_its_owner_freed_it(how):
    # before: buf.clear(7) after ctx.close() wrote into freed memory (segfault)
    run_child(f"""
    how = {how!r}
    be = gg.device("CPU").backend(1)
    ctx = gg.Context(); a = ctx.from_numpy(np.ones(1 << 16, np.float32))
    if how == "scheduler reset":
        bufs = ctx.alloc(be); y = a + a
        s = gg.Scheduler([be]); s.compute(gg.Graph(y)); buf = y.buffer
        buf.clear(0); s.reset()
    else:
        bufs = ctx.alloc(be); buf = a.buffer
        buf.clear(0)
        (ctx if how == "context closed" else bufs[0]).close()
    assert buf.closed
    expect(errors.ClosedError, lambda: buf.clear(7))
    expect(errors.ClosedError, lambda: buf.size)
    repr(buf)
    """)


# -- index operands ------------------------------------------------------------------------------

INDEX_CASES = {
    # name: (index expression over leaf `ix` (f32 values x) and table rows R, error or None)
    "argsort wider than the table": ("gg.argsort(x)", "ranks in 0..3"),
    "top_k wider than the table": ("gg.top_k(x, 2)", "ranks in 0..3"),
    "argsort fits": ("gg.argsort(x3)", None),
    "view of an input out of range": ("ix.reshape(4)", "out of range"),
    "cont of a view of an input": ("gg.cont(ix.T).reshape(4)", "out of range"),
    "get_rows of an index table": ("gg.get_rows(ix.reshape(4, 1), ok).reshape(4)", "out of range"),
    "argmax wider than the table": ("gg.argmax(x.reshape(1, 4)).reshape(1)", "ranks in 0..3"),
    "converted from floats": ("gg.cpy(x, ctx.tensor(gg.i32, (4,)))", "no known range"),
}


@pytest.mark.parametrize("op", ["get_rows", "set_rows"])
@pytest.mark.parametrize("case", list(INDEX_CASES))
def test_index_operands_by_provenance(case, op):
    # before: get_rows(table, argsort(x)) and get_rows(table, ix.reshape(4)) with values past
    # the table aborted in the CPU kernel (GGML_ASSERT(i01 >= 0 && i01 < ne01)); only leaves
    # were range-checked
    expr, err = INDEX_CASES[case]
    run_child(f"""
    be = gg.device("CPU").backend(1)
    ctx = gg.Context()
    a = ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))        # 3 rows
    x = ctx.from_numpy(np.array([4., 1, 3, 2], np.float32))                   # 4 values
    x3 = ctx.from_numpy(np.array([3., 1, 2], np.float32))
    ix = ctx.from_numpy(np.array([[5, 1], [7, 2]], np.int32))                 # 5, 7 too big
    ok = ctx.from_numpy(np.array([0, 1, 2, 3], np.int32))
    def build():
        idx = {expr}
        if {op!r} == "get_rows":
            return gg.get_rows(a, idx)
        src = ctx.from_numpy(np.zeros((idx.shape[0], 4), np.float32))
        return gg.set_rows(a, src, idx)
    def go():
        y = build(); ctx.alloc(be); be.compute(gg.Graph(y)); return y
    if {err is None!r}:
        go()
    else:
        expect(errors.InvalidArgument, go, {err!r})
    """)


def test_index_cases_reach_every_origin():
    # the generator above covers each branch of index_origin: leaves, moves, ranks, get_rows
    # of an index table, and an unknown op
    from ggml_py.ops import index
    assert index._RANKS and index._MOVES
    exprs = " ".join(e for e, _ in INDEX_CASES.values())
    for word in ("argsort", "top_k", "argmax", "reshape", "cont", "get_rows", "cpy"):
        assert word in exprs


# -- RPC: a peer that answers HELLO once ---------------------------------------------------------

class HelloOnceServer:
    """A misbehaving peer: answers the first connection's HELLO as a ggml RPC server of this
    build's protocol would (size, then major/minor/patch, padding and connection caps), and
    closes every later connection at once."""

    def __init__(self, version: tuple[int, int, int]) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.version = version
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                if self.connections == 1:
                    head = conn.recv(9)
                    n = struct.unpack("<Q", head[1:9])[0]
                    while n > 0:
                        n -= len(conn.recv(n))
                    reply = bytes([*self.version, 0]) + bytes(24)
                    conn.sendall(struct.pack("<Q", len(reply)) + reply)

    def close(self) -> None:
        self.sock.close()


def test_rpc_peer_that_answers_hello_once():
    # before: rpc.connect aborted the process in ggml's client ("Remote RPC server crashed or
    # returned malformed response") on the connection it opened after our HELLO
    from ggml_py import rpc
    peer = HelloOnceServer(rpc._our_version())
    try:
        run_child(f"""
        from ggml_py import rpc
        expect(errors.RPCError, lambda: rpc.connect({peer.endpoint!r}, timeout=5),
               "answered ggml's HELLO once", "new connection")
        """)
        assert peer.connections >= 2          # the first one answered, the next ones closed
    finally:
        peer.close()


# -- scheduler -----------------------------------------------------------------------------------

def test_set_input_takes_leaves_only():
    # before: set_input() on a view or an op result aborted (GGML_ASSERT(tensor->op == NONE))
    run_child("""
    ctx = gg.Context(); a = ctx.tensor(gg.f32, (4, 4))
    for t in (a.view((2, 4)), a.reshape(16), a.T, a + a, gg.cont(a)):
        expect(errors.InvalidArgument, t.set_input, "not a leaf")
    a.set_input()
    """)


def test_scheduler_backend_arguments_are_its_own():
    # before: buffer_size of a backend not in the scheduler aborted
    run_child("""
    be, other = gg.device("CPU").backend(1), gg.device("CPU").backend(1)
    s = gg.Scheduler([be])
    expect(errors.InvalidArgument, lambda: s.buffer_size(other), "not one of")
    ctx = gg.Context(); t = ctx.tensor(gg.f32, (4,))
    expect(errors.InvalidArgument, lambda: s.set_backend(t, other), "not one of")
    expect(errors.InvalidType, lambda: s.buffer_size("CPU"))
    assert s.buffer_size(be) >= 0
    """)


def test_pins_do_not_accumulate_across_graphs():
    # before: pinning each new graph's nodes died after about 25 graphs (ggml's hash set of
    # pins, sized for one graph, overflowed: "fatal error" in ggml-impl.h)
    run_child("""
    be = gg.device("CPU").backend(1)
    s = gg.Scheduler([be], graph_size=64)
    for i in range(120):
        ctx = gg.Context(); a = ctx.from_numpy(np.ones(4, np.float32)); ctx.alloc(be)
        y = a
        for k in range(20):
            y = y + a
        g = gg.Graph(y)
        for n in g.nodes:
            s.set_backend(n, be)
        assert s.backend_of(g.nodes[0]) is be
        s.compute(g)
        assert y.numpy()[0] == 21
    """, timeout=120)


# -- lifetimes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("export", ["numpy view", "dlpack"])
def test_buffer_closed_by_hand_under_an_export(export):
    # before: the buffer's memory was freed under the view (export tokens protected only
    # Context.close): the view read freed memory (garbage, or a segfault once unmapped)
    run_child(f"""
    n = 1 << 22                                  # 16 MiB: freed memory goes back to the OS
    be = gg.device("CPU").backend(1)
    ctx = gg.Context(); t = ctx.tensor(gg.f32, (n,)); bufs = ctx.alloc(be)
    t.set(np.full(n, 3, np.float32))
    v = t.numpy() if {export!r} == "numpy view" else np.from_dlpack(t)
    bufs[0].close()
    assert not t.is_allocated
    junk = [gg.device("CPU").buffer_type.alloc(4 * n) for _ in range(4)]
    for b in junk:
        b.clear(7)
    assert (v == 3).all(), v[:4]
    v[:] = 5                                      # still writable memory of ours
    del v; gc.collect()
    """)


def test_dlpack_refused_by_the_consumer_does_not_leak():
    # before: np.from_dlpack of a bf16 tensor raised SystemError (the capsule destructor ran
    # Python code with numpy's exception set) and left its export alive
    run_child("""
    from ggml_py import dlpack
    ctx = gg.Context(); t = ctx.tensor(gg.bf16, (4,)); ctx.alloc(gg.device("CPU").backend(1))
    for _ in range(3):
        try:
            np.from_dlpack(t)
        except SystemError as e:
            raise AssertionError(f"numpy's own error was lost: {e}")
        except (RuntimeError, BufferError, TypeError) as e:
            pass
        else:
            raise AssertionError("numpy took bf16")
    gc.collect()
    assert not dlpack._LIVE, len(dlpack._LIVE)
    # a capsule taken and dropped unconsumed, and one consumed, end the same way
    u = ctx.tensor(gg.f32, (4,)); ctx.alloc(gg.device("CPU").backend(1))
    c = u.__dlpack__(); a = np.from_dlpack(u)
    assert len(dlpack._LIVE) == 2
    del c, a; gc.collect()
    assert not dlpack._LIVE, len(dlpack._LIVE)
    ctx.close()
    """)


def test_forked_child_computes_after_a_multithreaded_parent():
    # before: the child hung in libgomp (no at-fork handler) at its first multi-threaded compute
    run_child("""
    be = gg.device("CPU").backend(2)
    def run(be):
        ctx = gg.Context(); a = ctx.from_numpy(np.ones((64, 64), np.float32)); ctx.alloc(be)
        y = a @ a; be.compute(gg.Graph(y)); return float(y.numpy()[0, 0])
    assert run(be) == 64
    pid = os.fork()
    if pid == 0:
        ok = run(be) == 64 and run(gg.device("CPU").backend(4)) == 64 and be.n_threads == 1
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    assert be.n_threads == 2                       # the parent keeps its threads
    assert run(be) == 64
    """, timeout=60)
