"""The everyday surface tells the truth (issue 32): numpy mixing, set's shape rule, names that
say what they count, ggml's log through logging, the CLI."""
import logging
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import ggml_py as gg
from support import ROOT, child_env


@pytest.fixture
def be():
    with gg.device("CPU").backend() as b:
        yield b


def _computed(be, t):
    be.compute(gg.Graph(t))
    return t.numpy(copy=True)


# -- 1. a tensor with an array-like on either side ---------------------------------------------
OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "@": np.matmul}


def _apply(sym, x, y):
    return {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "/": lambda: x / y,
            "@": lambda: x @ y}[sym]()


@pytest.mark.parametrize("allocated", [False, True], ids=["before-alloc", "after-alloc"])
@pytest.mark.parametrize("sym", list(OPS))
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("operand", ["leaf", "op-result"])
def test_array_on_either_side_is_a_constant_leaf(be, sym, side, operand, allocated):
    """Every operator, the array on either side, the tensor a leaf or an op result, its context
    allocated before or after: a Tensor comes back (numpy never takes over) and its values are
    numpy's, with broadcasting."""
    rng = np.random.default_rng(7)
    X = rng.uniform(1, 2, (3, 3)).astype(np.float32)
    A = rng.uniform(1, 2, (3, 3) if sym == "@" else (3,)).astype(np.float64)   # converted
    ctx = gg.Context()
    x = ctx.from_numpy(X)
    if allocated:
        ctx.alloc(be)
    t = x if operand == "leaf" else x * 1.5
    ref_t = X if operand == "leaf" else X * np.float32(1.5)
    r = _apply(sym, t, A) if side == "right" else _apply(sym, A, t)
    assert isinstance(r, gg.Tensor), type(r)
    if not allocated:
        ctx.alloc(be)
    ref = OPS[sym](ref_t, A.astype(np.float32)) if side == "right" else \
        OPS[sym](A.astype(np.float32), ref_t)
    np.testing.assert_allclose(_computed(be, r), ref, rtol=1e-5)


def test_lists_and_numpy_scalars_of_arrays(be):
    ctx = gg.Context()
    x = ctx.from_numpy(np.ones((2, 3), np.float32))
    y = [1, 2, 3] + x * 2 - np.array([[1.0], [2.0]])     # a list, a column: broadcasting
    ctx.alloc(be)
    np.testing.assert_array_equal(_computed(be, y), [[2, 3, 4], [1, 2, 3]])


def test_array_dtype_converted_or_refused(be):
    ctx = gg.Context()
    x = ctx.from_numpy(np.ones(3, np.float32))
    i = ctx.from_numpy(np.ones(3, np.int32))
    with pytest.raises(gg.InvalidType, match="same_kind"):
        x + np.ones(3, np.complex64)
    with pytest.raises(gg.InvalidType, match="same_kind"):
        i + np.ones(3, np.float32)              # floats do not become ints silently
    with pytest.raises(gg.InvalidArgument):
        x + np.ones(4, np.float32)              # numpy's broadcasting rules
    q = ctx.tensor(gg.q4_0, (32,))
    with pytest.raises(gg.InvalidType, match="plain-typed"):
        q + np.ones(32, np.float32)


def test_numpy_never_takes_over():
    assert gg.Tensor.__array_ufunc__ is None
    ctx = gg.Context()
    x = ctx.from_numpy(np.ones(3, np.float32))
    assert isinstance(np.ones(3) * x, gg.Tensor)
    assert isinstance(np.float32(2) * x, gg.Tensor)
    with pytest.raises(TypeError):
        np.add(np.ones(3), x)                   # a ufunc called by name: refused, not eager


# -- 2. set refuses another shape --------------------------------------------------------------
def test_set_refuses_another_shape(be):
    ctx = gg.Context()
    t = ctx.tensor(gg.f32, (2, 3))
    ctx.alloc(be)
    for bad in (np.zeros((3, 2), np.float32), np.zeros(6, np.float32), np.zeros((1, 2, 3), np.float32)):
        with pytest.raises(gg.InvalidArgument, match="shape"):
            t.set(bad)
        with pytest.raises(gg.InvalidArgument, match="shape"):
            be.set_async(t, bad)
    t.set(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))


def test_set_flat_writes_a_run_in_memory_order(be):
    ctx = gg.Context()
    t = ctx.tensor(gg.f32, (2, 3))
    ctx.alloc(be)
    t.set(np.full((2, 3), -7, np.float32))
    t.set(np.arange(6, dtype=np.float32), flat=True)
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
    t.set(np.array([40, 50], np.float32), offset=8, flat=True)           # a run at a byte offset
    np.testing.assert_array_equal(t.numpy().ravel(), [0, 1, 40, 50, 4, 5])
    t.set(np.float32([9]).view(np.uint8), offset=20, flat=True)          # raw bytes
    assert t.numpy()[1, 2] == 9
    with pytest.raises(gg.InvalidArgument, match="flat=True"):
        t.set(np.zeros((2, 3), np.float32), offset=4)
    be.set_async(t, np.ones(6, np.float32), flat=True)
    be.synchronize()
    assert (t.numpy() == 1).all()


# -- 4. names that say what they count ---------------------------------------------------------
def test_caps_are_the_struct_fields():
    from ggml_py.raw import ffi
    fields = [n for n, _ in ffi.typeof("struct ggml_backend_dev_caps").fields]
    caps = gg.device("CPU").caps
    assert [f.rstrip("_") for f in caps._fields] == fields
    if "mmap_support" in fields:
        assert isinstance(caps.mmap_support, bool)


def test_backends_named_after_their_device(rpc_devs):
    for d in rpc_devs:
        with d.backend() as b:
            assert b.name.startswith(d.name + "["), (b.name, d.name)
    names = {d.backend().name for d in rpc_devs}
    assert len(names) == len(rpc_devs)


def test_scheduler_counts_graph_copies_and_tensor_copies(rpc_devs):
    rpc = rpc_devs[0].backend()
    cpu = gg.device("CPU").backend()
    ctx = gg.Context()
    x = ctx.from_numpy(np.arange(8, dtype=np.float32))
    ctx.alloc(cpu)
    m = x * 2.0
    y = gg.exp(m)
    sched = gg.Scheduler([rpc, cpu])
    g = gg.Graph(y)
    sched.set_backend(m, rpc)
    sched.set_backend(y, cpu)
    sched.compute(g)
    assert sched.n_graph_copies == 1
    assert sched.n_splits == 2
    assert sched.n_tensor_copies == 2                  # x sent to the server, m read back
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sched.n_copies == sched.n_graph_copies   # the old name stays, deprecated
    np.testing.assert_allclose(y.numpy(), np.exp(np.arange(8) * 2.0), rtol=1e-5)
    html = sched._repr_html_()
    assert "copied between backends" in html and "graph cop" in html


def test_one_function_count():
    from ggml_py._api import function_names
    from ggml_py.raw import ffi, lib
    names = function_names(ffi, lib)
    assert not any(n.startswith("ggml_py_") for n in names)
    assert gg.build_info()["functions"] == len(names)


# -- 5. ggml's log through logging -------------------------------------------------------------
def test_ggml_log_reaches_logging(caplog, be):
    ctx = gg.Context()
    x = ctx.from_numpy(np.ones(3, np.float32))
    ctx.alloc(be)
    with caplog.at_level(logging.DEBUG, logger="ggml"):
        gg.Graph(x * 2).to_dot()
        with pytest.raises(gg.OutOfMemory):
            gg.device("CPU").buffer_type.alloc(1 << 50)
    recs = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "ggml"]
    assert any(lv == "DEBUG" and "dot -Tpng" in m for lv, m in recs), recs
    assert any(lv == "ERROR" and "insufficient memory" in m for lv, m in recs), recs


def test_ggml_writes_nothing_to_stderr_behind_python():
    code = ("import numpy as np, ggml_py as gg\n"
            "ctx = gg.Context(); x = ctx.from_numpy(np.ones(3, np.float32))\n"
            "be = gg.device('CPU').backend(); ctx.alloc(be); gg.Graph(x * 2).to_dot()\n"
            "try: gg.device('CPU').buffer_type.alloc(1 << 50)\n"
            "except gg.OutOfMemory: print('oom')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=child_env(), timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "oom", r.stderr
    assert r.stderr == "", r.stderr


def test_log_callback_never_raises_into_c(caplog):
    from ggml_py import _log

    class Boom(logging.Handler):
        def emit(self, record):
            raise RuntimeError("a handler that fails")

    h = Boom()
    _log.logger.addHandler(h)
    try:
        with caplog.at_level(logging.DEBUG, logger="ggml"):
            _log._on_log(3, gg.ffi.new("char[]", b"from C\n"), gg.ffi.NULL)   # swallowed
    finally:
        _log.logger.removeHandler(h)


# -- 7. the CLI --------------------------------------------------------------------------------
def _main(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ggml_py", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=child_env(**(env or {})))


def test_cli_usage_names_the_commands_and_version():
    r = _main("--help")
    usage = r.stdout.split("\n\n")[0]
    assert "rpc-server" in usage and "compare" in usage and "--version" in usage
    assert "``" not in r.stdout
    v = _main("--version")
    assert v.returncode == 0 and v.stdout.startswith(f"ggml_py {gg.__version__} (ggml ")


def test_cli_without_a_build_says_one_line():
    r = _main(env={"GGML_PY_BUILD": "/no/such"})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "GGML_PY_BUILD=/no/such" in r.stderr


def test_device_lookup_message_reads_well():
    n = len(gg.devices())
    with pytest.raises(gg.NotFound) as e:
        gg.device(n + 5)
    assert "there are" not in str(e.value) and "CPU" in str(e.value)
