"""The opt crash and silent-wrong classes of issue 28, one test (or generator) per class.

The rules (docs/validation.md, "GGUF and opt classes"), each in one place of ``ggml_py/opt.py``:

- ``_opt_check.model``: what ggml-opt asserts on is refused when the Optimizer is made (inputs that
  are views or op results, of a type other than the dataset's, parameters that are not
  leaves, tensors in a buffer no backend of the optimizer can use);
- ``Optimizer._using``: every call into ggml-opt holds the optimizer (a second thread raises,
  close waits) and asks that its backends and tensors' servers are alive first;
- ``gradients`` runs the checks a compute runs (``Graph.prepare``: leaves need memory, every
  buffer usable by the backend, every op supported; index inputs in range; live servers);
- ``_finite``: data and labels are finite, and a parameter that becomes NaN or inf raises.

Cases that used to kill the process run in a child process.
"""
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ggml_py as gg
from support import RELEASE, child_env, needs_release
from ggml_py import opt

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import sys, threading, time, numpy as np, ggml_py as gg
from ggml_py import opt
rng = np.random.default_rng(0)
X = rng.standard_normal((64, 2)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 64)]
def model(be, batch=16):
    ctx = gg.Context(); x = ctx.tensor(gg.f32, (batch, 2)); W = ctx.tensor(gg.f32, (3, 2))
    ctx.alloc(be); W.set(rng.standard_normal((3, 2)).astype(np.float32))
    return ctx, x, W, gg.mul_mat(W, x)
"""


def _child(code: str, timeout: float = 120) -> str:
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], cwd=ROOT,
                       env=child_env(GGML_NO_BACKTRACE="1"), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}"
    return r.stdout


@pytest.fixture
def cpu_backend():
    with gg.device("CPU").backend(n_threads=1) as be:
        yield be


def _data(rng, n=64):
    X = rng.standard_normal((n, 2)).astype(np.float32)
    return X, np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]


# -- what ggml-opt asserts on is refused when the Optimizer is made ----------------------------

def test_model_inputs_ggml_opt_asserts_on_are_refused():
    out = _child("""
        be = gg.device("CPU").backend(n_threads=1)
        def attempt(name, make):
            try:
                make()
                print(name, "accepted")
            except gg.GGMLError as e:
                print(name, "refused", type(e).__name__)

        def view_input():
            ctx = gg.Context(); x = ctx.tensor(gg.f32, (32,)); W = ctx.tensor(gg.f32, (3, 2))
            ctx.alloc(be); W.set(np.ones((3, 2), np.float32)); x2 = x.reshape(16, 2)
            opt.Optimizer(be, x2, gg.mul_mat(W, x2), [W]).epoch(opt.Dataset(X, Y))

        def view_param():
            ctx = gg.Context(); x = ctx.tensor(gg.f32, (16, 2)); W = ctx.tensor(gg.f32, (6,))
            ctx.alloc(be); W.set(np.ones(6, np.float32)); W2 = W.reshape(3, 2)
            opt.Optimizer(be, x, gg.mul_mat(W2, x), [W2]).epoch(opt.Dataset(X, Y))

        def other_device():
            srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
            ctx, x, W, logits = model(dev.backend())
            opt.Optimizer(be, x, logits, [W]).epoch(opt.Dataset(X, Y))

        for name, make in [("view_input", view_input), ("view_param", view_param),
                           ("other_device", other_device)]:
            attempt(name, make)
    """)
    assert out.split("\n")[:3] == ["view_input refused InvalidArgument",
                                   "view_param refused InvalidArgument",
                                   "other_device refused InvalidArgument"], out


def test_inputs_of_a_type_other_than_the_datasets_are_refused():
    out = _child("""
        be = gg.device("CPU").backend(n_threads=1)
        kinds = [t for t in gg.TYPES.values() if t.block_size == 1 and t.name != "f32"]
        print(len(kinds))
        for t in kinds:
            ctx = gg.Context(); x = ctx.tensor(t, (16, 2)); W = ctx.tensor(gg.f32, (3, 2))
            xf = ctx.tensor(gg.f32, (16, 2))
            ctx.alloc(be); W.set(np.ones((3, 2), np.float32))
            try:
                opt.Optimizer(be, x, gg.mul_mat(W, xf), [W]).epoch(opt.Dataset(X, Y))
                print(t.name, "accepted")
            except gg.GGMLError as e:
                print(t.name, "refused", "f32" in str(e))
    """)
    n, *lines = out.splitlines()
    assert int(n) >= 4 and len(lines) == int(n), out       # every plain type but f32
    assert all(line.endswith("refused True") for line in lines), out


# -- every call holds the optimizer and asks that its servers are alive -----------------------

def test_training_on_an_rpc_device_follows_the_release(rpc_devs):
    """ggml-opt clears its gradients with ggml_backend_tensor_memset, which asserts on an RPC
    buffer before 0.20.2 (ggml-rpc had no memset_tensor): refused by name there, built after."""
    with rpc_devs[0].backend() as rb, gg.device("CPU").backend(n_threads=1) as cb, \
            gg.Context() as ctx:
        x, W = ctx.tensor(gg.f32, (16, 2)), ctx.tensor(gg.f32, (3, 2))
        ctx.alloc(rb)
        W.set(np.ones((3, 2), np.float32))
        logits = gg.mul_mat(W, x)
        if RELEASE < (0, 20, 2):
            with pytest.raises(gg.UnsupportedError, match=r"training on an RPC device \(RPC.*\) "
                                                          r"needs ggml 0\.20\.2 or newer"):
                opt.Optimizer([rb, cb], x, logits, [W])
            return
        with opt.Optimizer([rb, cb], x, logits, [W]) as t:
            assert t is not None


@needs_release("0.20.2", "training on an RPC device")
def test_an_epoch_after_the_rpc_server_died_raises():
    out = _child("""
        srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
        rb, cb = dev.backend(), gg.device("CPU").backend(n_threads=1)
        ctx, x, W, logits = model(rb)
        t = opt.Optimizer([rb, cb], x, logits, [W]); d = opt.Dataset(X, Y)
        t.epoch(d)
        srv.kill()
        for name, call in [("epoch", lambda: t.epoch(d)), ("evaluate", lambda: t.evaluate(d)),
                           ("reset", t.reset)]:
            try:
                call(); print(name, "ran")
            except ConnectionError as e:
                print(name, "raised")
    """)
    assert out.split() == ["epoch", "raised", "evaluate", "raised", "reset", "raised"], out


def test_a_second_thread_in_one_trainer_raises_and_close_waits():
    out = _child("""
        be = gg.device("CPU").backend(n_threads=1)
        ctx, x, W, logits = model(be)
        t = opt.Optimizer(be, x, logits, [W])
        d = opt.Dataset(np.repeat(X, 400, 0), np.repeat(Y, 400, 0))
        busy, errors = [], []
        def run():
            try:
                for _ in range(3):
                    t.epoch(d)
            except gg.GGMLError as e:
                (busy if "another thread" in str(e) else errors).append(e)
        threads = [threading.Thread(target=run) for _ in range(3)]
        [th.start() for th in threads]; [th.join() for th in threads]
        print("busy", len(busy) > 0, "errors", errors)
        th = threading.Thread(target=run); th.start(); time.sleep(0.02)
        t.close(); th.join()                  # waits for the running epoch, then closes
        print("closed", t.closed)
        try:
            t.epoch(d)
        except gg.errors.ClosedError:
            print("closed raises")
    """)
    assert "busy True errors []" in out and "closed True" in out and "closed raises" in out, out


# -- gradients runs the checks a compute runs ---------------------------------------------------

def test_gradients_refuse_leaves_without_memory(cpu_backend):
    ctx = gg.Context()
    x = ctx.tensor(gg.f32, (4, 2))                     # never allocated
    c2 = gg.Context()
    W = c2.tensor(gg.f32, (3, 2))
    c2.alloc(cpu_backend)
    W.set(np.ones((3, 2), np.float32))
    with pytest.raises(gg.errors.InvalidArgument, match="no memory"):
        opt.gradients(gg.sum(gg.mul_mat(W, x)), [W], cpu_backend)


def test_gradients_on_a_backend_that_cannot_use_the_parameters_raise():
    out = _child("""
        srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
        rb, cb = dev.backend(), gg.device("CPU").backend(n_threads=1)
        ctx = gg.Context(); x = ctx.tensor(gg.f32, (4, 2)); W = ctx.tensor(gg.f32, (3, 2))
        ctx.alloc(rb); x.set(np.ones((4, 2), np.float32)); W.set(np.ones((3, 2), np.float32))
        loss = gg.sum(gg.mul_mat(W, x))
        try:
            opt.gradients(loss, [W], cb)
        except gg.GGMLError as e:
            print("refused", type(e).__name__)
        (g,) = opt.gradients(loss, [W], rb)          # the server still serves
        print("served", g.tolist() == [[4.0, 4.0]] * 3)
        srv.kill()
        try:
            opt.gradients(loss, [W], rb)
        except ConnectionError:
            print("dead raises")
    """)
    assert out.split("\n")[:3] == ["refused InvalidArgument", "served True", "dead raises"], out


def test_gradients_of_out_of_range_indices_raise():
    out = _child("""
        be = gg.device("CPU").backend(n_threads=1)
        ctx = gg.Context(); table = ctx.tensor(gg.f32, (4, 3)); idx = ctx.tensor(gg.i32, (2,))
        ctx.alloc(be); table.set(np.ones((4, 3), np.float32)); idx.set(np.array([1, 9], np.int32))
        try:
            opt.gradients(gg.sum(gg.get_rows(table, idx)), [table], be)
        except gg.errors.InvalidArgument as e:
            print("refused", "out of range" in str(e))
    """)
    assert "refused True" in out, out


# -- non-finite numbers: refused in data, detected in parameters --------------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([np.nan, np.inf, -np.inf]), st.sampled_from(["data", "labels"]),
       st.integers(0, 63), st.integers(0, 1))
def test_non_finite_data_is_refused(value, where, row, col):
    X, Y = _data(np.random.default_rng(row))
    (X if where == "data" else Y)[row, col] = value
    with pytest.raises(gg.errors.InvalidArgument, match="not finite"):
        opt.Dataset(X, Y)


def test_parameters_that_become_non_finite_raise(cpu_backend, rng):
    X, Y = _data(rng)
    X *= 1e30                                         # finite, but the steps overflow
    ctx = gg.Context()
    x = ctx.tensor(gg.f32, (16, 2))
    W = ctx.tensor(gg.f32, (3, 2))
    ctx.alloc(cpu_backend)
    W.set(np.ones((3, 2), np.float32))
    t = opt.Optimizer(cpu_backend, x, gg.mul_mat(W, x), [W], loss="mse", optimizer="sgd",
                      lr=1e10)
    with pytest.raises(FloatingPointError, match="not finite"):
        for _ in range(3):
            t.epoch(opt.Dataset(X, Y))
    assert not np.isfinite(W.numpy()).all()
