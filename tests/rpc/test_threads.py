"""Objects used from several threads at once, with real threads: cffi releases the GIL around
every C call, so without the per-object locks these gave wrong results, lost tensors and
segfaults (closing a backend another thread computes on)."""
import threading

import numpy as np
import pytest

import ggml_py as gg
from support import needs_release

N_THREADS = 4


def _run(workers):
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 (collected, then raised by the test)
                errors.append(e)
        return run
    threads = [threading.Thread(target=wrap(w)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


@pytest.mark.parametrize("kind", ["CPU", pytest.param("RPC0", marks=needs_release("0.23.0", "an RPC server that survives this graph (0.20.2's aborts)"))])
def test_threads_computing_on_one_backend_get_their_own_results(rpc_devs, kind):
    with (gg.device("CPU") if kind == "CPU" else rpc_devs[0]).backend() as be:
        ctxs, jobs = [], []
        for i in range(N_THREADS):
            ctx = gg.Context()
            x = ctx.from_numpy(np.full((16, 16), float(i), np.float32))
            ctx.alloc(be)
            out = x * 2.0 + 1.0
            ctxs.append(ctx)
            jobs.append((x, out, gg.Graph(out), float(i)))

        def worker(job):
            x, out, g, v = job

            def run():
                for _ in range(30):
                    be.compute(g)
                    got = out.numpy(copy=True)
                    assert np.all(got == v * 2 + 1), (v, got[0, 0])
            return run
        errors = _run([worker(j) for j in jobs])
        assert not errors, errors[0]
        for c in ctxs:
            c.close()


def test_threads_building_in_one_context_lose_nothing(cpu):
    with cpu.backend() as be, gg.Context(capacity=64) as ctx:
        a = ctx.from_numpy(np.ones(8, np.float32))
        ctx.alloc(be)
        made = [[] for _ in range(N_THREADS)]

        def worker(i):
            def run():
                t = a
                for _ in range(200):
                    t = t + a
                    made[i].append(t)
            return run
        errors = _run([worker(i) for i in range(N_THREADS)])
        assert not errors, errors[0]
        ptrs = {int(gg.ffi.cast("uintptr_t", t.ptr)) for m in made for t in m}
        assert len(ptrs) == N_THREADS * 200                 # every tensor distinct
        for m in made:
            be.compute(gg.Graph(m[-1]))
            assert m[-1].numpy()[0] == 201


def test_closing_a_backend_another_thread_computes_on_is_safe(cpu):
    for _ in range(5):
        be = cpu.backend()
        ctx = gg.Context()
        x = ctx.from_numpy(np.ones((64, 64), np.float32))
        ctx.alloc(be)
        out = x
        for _ in range(50):
            out = gg.tanh(out @ x)
        g = gg.Graph(out)
        started = threading.Event()

        def compute():
            started.set()
            for _ in range(20):
                try:
                    be.compute(g)
                except gg.ClosedError:
                    return                     # closed between two computes: refused
        errors = _run([compute, lambda: (started.wait(), be.close())])
        assert not errors, errors[0]
        assert be.closed
        ctx.close()


CLOSE_RACE = """
import random, sys, threading, time, numpy as np, ggml_py as gg
rng = random.Random(int(sys.argv[1]))
for it in range(int(sys.argv[2])):
    print("ROUND", it, flush=True)
    be = gg.device("CPU").backend()
    ctx, dep = gg.Context(), gg.Context()
    x = ctx.from_numpy(np.ones((32, 32), np.float32))
    y = dep.from_numpy(np.ones((32, 32), np.float32))
    z = dep.tensor(gg.f32, (32, 32))
    (xbuf,), (ybuf,) = ctx.alloc(be), dep.alloc(be)
    # what closes: the graph's context, a context it reads from, the backend, or a buffer
    victim = rng.choice([ctx, dep, be, xbuf, ybuf])
    started = threading.Event()
    errors = []

    def work():
        started.set()
        try:
            for _ in range(200):
                x.set(np.ones((32, 32), np.float32))
                be.set_async(y, np.ones((32, 32), np.float32))
                be.synchronize()
                out = gg.relu(x @ y) + 1.0
                be.compute(gg.Graph(out))
                assert out.numpy(copy=True)[0, 0] == 33.0
                assert out.op == "SCALE" and out.src[0].op == "RELU"   # records, read in C
                gg.copy(out, z)
                assert be.get_async(z, np.empty((32, 32), np.float32))[0, 0] in (0.0, 33.0)
                be.synchronize()
        except gg.ClosedError:
            pass                          # closed: refused, no crash
        except gg.InvalidArgument as e:   # a closed buffer leaves its tensors without memory
            if "no memory" not in str(e):
                errors.append(e)
        except BaseException as e:        # noqa: BLE001 (reported by the main thread)
            errors.append(e)
    t = threading.Thread(target=work)
    t.start()
    started.wait()
    time.sleep(rng.random() * 0.004)      # somewhere inside building, computing or reading
    victim.close()
    t.join()
    ctx.close(); dep.close(); be.close()
    if errors:
        raise errors[0]
print("ALL")
"""


def test_closing_a_context_while_another_thread_builds_and_computes():
    # Closing the graph's context, a context it reads from, the backend or a buffer at a
    # random moment while another thread sets, builds ops and graphs, computes and reads
    # data and records: a clean refusal, never freed memory under ggml (Graph() walked a
    # context closed meanwhile and crashed CI once; a view's init met a buffer closed
    # meanwhile and aborted).
    _rounds_in_a_child(CLOSE_RACE, 400)


def _rounds_in_a_child(script: str, rounds: int) -> None:
    """`script` (it prints ROUND k before each round and ALL at the end) in a child process,
    so a crash is the test's failure and names the round."""
    import subprocess
    import sys
    from support import child_env
    r = subprocess.run([sys.executable, "-c", script, "0", str(rounds)], capture_output=True,
                       text=True, timeout=600, env=child_env())
    last = [line for line in r.stdout.splitlines() if line.startswith("ROUND")][-1:]
    assert r.returncode == 0, f"exit {r.returncode} at {last}: {r.stderr[-3000:]}"
    assert r.stdout.strip().splitlines()[-1] == "ALL"


def test_a_buffer_closed_while_another_thread_sets_tensors(cpu):
    with cpu.backend() as be:
        for _ in range(5):
            ctx = gg.Context()
            t = ctx.tensor(gg.f32, (256, 256))
            (buf,) = ctx.alloc(be)
            data = np.ones((256, 256), np.float32)
            started = threading.Event()

            def setter():
                started.set()
                for _ in range(200):
                    try:
                        t.set(data)
                    except gg.InvalidArgument as e:  # the buffer went: "has no memory"
                        assert "has no memory" in str(e)
                        return
            errors = _run([setter, lambda: (started.wait(), buf.close())])
            assert not errors, errors[0]
            ctx.close()


def test_threads_that_first_use_the_package_together_all_get_the_face():
    """The face loads on first use (PEP 562): threads that first touch it at the same time
    must all get the names, not an AttributeError while another thread loads."""
    import subprocess
    import sys
    from support import child_env
    code = ("import threading, ggml_py as gg\nerrs = []\nstart = threading.Barrier(8)\n"
            "def use():\n    start.wait()\n    try:\n        gg.Tensor, gg.add, gg.f32, gg.Context\n"
            "    except Exception as e:\n        errs.append(repr(e))\n"
            "ts = [threading.Thread(target=use) for _ in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\nprint('errors', errs)")
    for _ in range(5):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, env=child_env())
        assert r.returncode == 0 and r.stdout.strip() == "errors []", r.stdout + r.stderr[-2000:]


BUILD_RACE = """
import random, sys, threading, time, ggml_py as gg
rng = random.Random(int(sys.argv[1]))
for it in range(int(sys.argv[2])):
    print("ROUND", it, flush=True)
    ctx = gg.Context(capacity=rng.choice([16, 64, 4096]))   # small: chunks open meanwhile
    x = ctx.tensor(gg.f32, (8, 8))
    w = ctx.tensor(gg.f32, (8, 8))
    started = threading.Barrier(3)
    errors = []

    def work():
        started.wait()
        try:
            t = x
            for _ in range(300):    # the checked ops, from two threads at once
                t = gg.rms_norm(gg.mul_mat(w, t) + x, 1e-5)
                p = gg.cont(gg.permute(gg.reshape(t, (2, 4, 8)), (1, 0, 2)))
                t = gg.silu(gg.reshape(p, (8, 8)))
        except gg.ClosedError:
            pass                          # closed: refused, no crash
        except BaseException as e:        # noqa: BLE001 (reported by the main thread)
            errors.append(e)
    ts = [threading.Thread(target=work) for _ in range(2)]
    for t in ts:
        t.start()
    started.wait()
    time.sleep(rng.random() * 0.003)
    ctx.close()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
print("ALL")
"""


def test_checked_ops_from_two_threads_while_a_third_closes_the_context():
    # The checked ops (one C call each) build under the context's mutex, which the Python
    # path and close() take too: two threads building in one context, chunks opening under
    # them, and the context closed at a random moment give results or ClosedError, never a
    # ggml abort (3 of 4 runs fail with the mutex taken out of helpers.c).
    _rounds_in_a_child(BUILD_RACE, 1000)
