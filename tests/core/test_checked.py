"""The checked ops (ggml_build/helpers.c) against the Python rules they stand in for.

Each checked op builds one ggml op in a single C call when the operands pass the op's rule,
and refuses (NULL, before ggml is called) otherwise, leaving the call to the op's Python path.
The promise: with or without the helpers, every call gives the same outcome, the same tensor
(op, type, shape, strides, parameters, operands) or the same exception with the same message.
A helper that accepted more than its rule would build what ggml then aborts on (or what the
Python path would have refused, or built differently).

The proof is a generator: random operands (every float type, integers, quantized, views that
are permuted, transposed, strided, sliced, reshaped, of placed or unplaced memory, from one or
two contexts) and random arguments (good, bad, bools, numpy scalars, NaN, huge ints) for every
op that has a checked form, run in two child processes, one with GGML_PY_NO_CHECKED=1, and
compared line by line.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import ggml_py as gg
from ggml_py.ops import _common

pytestmark = pytest.mark.skipif(_common.CHECKED_OPS is None,
                                reason="ABI-mode bindings: there are no checked ops to compare")

CASES = r"""
import random, sys
import numpy as np
import ggml_py as gg
from ggml_py import ffi, lib

seed, n = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
be = gg.device("CPU").backend()
TYPES = [gg.f32] * 5 + [gg.f16, gg.f16, gg.bf16, gg.i32, gg.i16, gg.i8, gg.f64, gg.q4_0, gg.q8_0]

# which checked ops built and which refused (to stderr: stdout is compared)
import collections
STATS = collections.Counter()
if gg.ops._common.CHECKED_OPS is not None:
    # every op calls its helper through a module name _C_<HELPER>: each is wrapped to count
    def counting(helper):
        def counted(*args):
            p = helper(*args)
            STATS[(helper.__name__, bool(p))] += 1
            return p
        return counted

    for _mod in (gg.ops.elementwise, gg.ops.linalg, gg.ops.nn, gg.ops.shape):
        for _name, _helper in list(vars(_mod).items()):
            if _name.startswith("_C_") and _helper is not None:
                setattr(_mod, _name, counting(_helper))


def dims(quant):
    nd = rng.randint(1, 4)
    d = [rng.choice([1, 1, 2, 3, 4, 6]) for _ in range(nd)]
    if quant:
        d[-1] = 32 * rng.randint(1, 2)
    return tuple(d)


def fresh(ctx, like=None):
    # a tensor, often shaped like `like` (so binary ops and matmuls meet their common case)
    t = rng.choice(TYPES) if like is None or rng.random() < 0.3 else (
        like.type if rng.random() < 0.7 else rng.choice(TYPES))
    quant = t.block_size > 1
    if like is not None and rng.random() < 0.6 and not quant and like.type.block_size == 1:
        shape = tuple(like.shape)
        if rng.random() < 0.3:     # a broadcastable or repeating one
            shape = tuple(1 if rng.random() < 0.4 else s for s in shape)
        if rng.random() < 0.2:
            shape = (1,) + shape if len(shape) < 4 else shape[1:]
    else:
        shape = dims(quant)
    return ctx.tensor(t, shape)


def viewed(x):
    # the same memory seen another way, or x itself
    k = rng.random()
    try:
        if k < 0.45 or x.type.block_size > 1:
            return x
        if k < 0.6 and x.ndim >= 2:
            return gg.transpose(x)
        if k < 0.75:
            ax = list(range(x.ndim)); rng.shuffle(ax)
            return gg.permute(x, tuple(ax))
        if k < 0.85:
            return gg.reshape(x, (x.size,))
        if k < 0.95 and x.shape[-1] > 1:   # every other element of the last axis
            sh = x.shape[:-1] + (x.shape[-1] // 2,)
            st = [x.type.type_size * 2]
            for s in reversed(x.shape[1:]):
                st.insert(0, st[0] * s)
            return gg.view(x, sh, 0, tuple(st[len(st) - len(sh):]))
        return gg.view(x, (1,), x.type.type_size)
    except gg.GGMLError:
        return x


def operand(ctx, other_ctx, like=None):
    c = other_ctx if rng.random() < 0.1 else ctx
    x = fresh(c, like)
    if rng.random() < 0.15:
        c.alloc(be)                 # placed memory: views of it are the Python path's
    return viewed(x)


def arg_int():
    return rng.choice([0, 1, 2, 3, -1, -2, 5, True, np.int64(2), 2 ** 70, 1.0, "2"])


def arg_float():
    return rng.choice([1.0, 0.5, 0.0, -1.0, 1e-5, float("nan"), 2, True, np.float32(0.25),
                       "x", None])


def shape_for(x):
    k = rng.random()
    if k < 0.5:                    # a valid one
        n = x.size
        out = []
        while n > 1 and len(out) < 3 and rng.random() < 0.7:
            f = rng.choice([d for d in range(1, n + 1) if n % d == 0])
            out.append(f); n //= f
        out.append(n); rng.shuffle(out)
        if rng.random() < 0.2:
            out[rng.randrange(len(out))] = -1
        elif rng.random() < 0.2:       # the same sizes, one of them a bool or a numpy int
            out.insert(rng.randrange(len(out) + 1), True) if len(out) < 4 else None
            out = [rng.choice([True, np.int64(1)]) if d == 1 else d for d in out]
        return tuple(out) if rng.random() < 0.85 else list(out)
    return tuple(arg_int() for _ in range(rng.randint(0, 5)))


def axes_for(x):
    ax = list(range(x.ndim)); rng.shuffle(ax)
    k = rng.random()
    if k < 0.7:
        return tuple(ax)
    if k < 0.8:
        return tuple(bool(a) if a < 2 else a for a in ax)
    if k < 0.85:
        return tuple(np.int64(a) for a in ax)
    if k < 0.9:                    # unhashable or array axes
        return tuple(rng.choice([[a], np.array(a), a]) for a in ax)
    return tuple(arg_int() for _ in range(rng.randint(0, 4)))


def record(t):
    p = t.ptr
    srcs = []
    for j in range(4):
        s = p.src[j]
        if s != ffi.NULL:
            srcs.append((ffi.string(lib.ggml_op_desc(s)).decode(), int(s.type),
                         tuple(int(v) for v in s.ne), tuple(int(v) for v in s.nb)))
    return ("ok", t.op, t.type.name, t.shape, t.ne, t.nb, bytes(ffi.buffer(p.op_params)).hex(),
            p.view_src != ffi.NULL, int(p.view_offs), tuple(srcs))


def one(ctx, other):
    a = operand(ctx, other)
    op = rng.choice(["add", "sub", "mul", "div", "+", "-", "*", "/", "mul_mat", "reshape",
                     "permute", "cont", "norm", "rms_norm", "soft_max", "rope_ext", "unary"])
    if op in ("add", "sub", "mul", "div", "+", "-", "*", "/"):
        b = operand(ctx, other, like=a)
        f = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}.get(
            op, lambda: getattr(gg, op)(a, b))
    elif op == "mul_mat":
        b = operand(ctx, other, like=a)
        if rng.random() < 0.5 and b.type.block_size == 1:    # inner dims that agree
            b = viewed(ctx.tensor(rng.choice([gg.f32, gg.f32, gg.f16, gg.i32]),
                                  tuple(rng.choice([1, 2, 3]) for _ in range(rng.randint(0, 2)))
                                  + (a.shape[-1],)))
        f = lambda: gg.mul_mat(a, b)
    elif op == "reshape":
        s = shape_for(a)
        if rng.random() < 0.1:          # one element: a shape of bools or numpy ints fits
            a = ctx.tensor(gg.f32, (1,) * rng.randint(1, 3))
            s = tuple(rng.choice([True, 1, np.int64(1), False]) for _ in range(rng.randint(1, 4)))
        f = lambda: gg.reshape(a, s)
    elif op == "permute":
        ax = axes_for(a)
        f = lambda: gg.permute(a, ax)
    elif op == "cont":
        if rng.random() < 0.4:          # gathering views of types the copy kernels gather or not
            a = gg.transpose(ctx.tensor(rng.choice([gg.i8, gg.f64, gg.i64, gg.f32]), (2, 3)))
        f = lambda: gg.cont(a)
    elif op in ("norm", "rms_norm"):
        e = arg_float()
        f = lambda: getattr(gg, op)(a, e)
    elif op == "soft_max":
        m = None if rng.random() < 0.3 else operand(ctx, other, like=a)
        s, mb = arg_float(), (0.0 if rng.random() < 0.7 else arg_float())
        f = lambda: gg.soft_max(a, m, s, mb)
    elif op == "rope_ext":
        if rng.random() < 0.05:         # a head wider than a C int (no memory: only metadata)
            a = ctx.tensor(gg.f16, (1, 1, 1, 2 ** 32 + rng.choice([0, 2])))
        ntok = a.ne[2] if rng.random() < 0.8 else rng.randint(1, 4)
        pos = ctx.tensor(gg.i32 if rng.random() < 0.85 else gg.f32,
                         (ntok,) if rng.random() < 0.9 else (ntok, 2))
        kw = {}
        if rng.random() < 0.4:
            kw["n_dims"] = rng.choice([None, a.ne[0], a.ne[0] // 2 * 2, 2, 3, 0, -2, True,
                                       2 ** 32 + 2])
        if rng.random() < 0.3:
            kw["mode"] = rng.choice([0, 2, 8, -1, np.int64(2)])
        if rng.random() < 0.2:
            kw[rng.choice(["freq_base", "freq_scale", "ext_factor", "attn_factor", "beta_fast",
                           "beta_slow"])] = arg_float()
        if rng.random() < 0.1:
            kw["n_ctx_orig"] = arg_int()
        f = lambda: gg.rope_ext(a, pos, **kw)
    else:
        name = rng.choice(gg.ops.elementwise.UNARY)
        f = lambda: getattr(gg, name)(a)
    try:
        return (op, record(f()))
    except Exception as e:              # the same class and message, both ways
        return (op, ("err", type(e).__name__, str(e)))


for case in range(n):
    # small capacities: chunks fill under the checked ops (they refuse, the Python path opens
    # the next chunk)
    cap = rng.choice([1, 2, 5, 4096, 4096])
    with gg.Context(capacity=cap) as ctx, gg.Context(capacity=cap) as other:
        print(case, one(ctx, other), flush=True)
print("DONE")
print(sorted(STATS.items()), file=sys.stderr)
"""


def _run(seed: int, n: int, checked: bool) -> tuple[list[str], str]:
    env = dict(os.environ)
    env.pop("GGML_PY_NO_CHECKED", None)
    if not checked:
        env["GGML_PY_NO_CHECKED"] = "1"
    r = subprocess.run([sys.executable, "-c", CASES, str(seed), str(n)], capture_output=True,
                       text=True, env=env, timeout=600)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines and lines[-1] == "DONE", (
        f"seed {seed} ({'with' if checked else 'without'} the checked ops) died with "
        f"{r.returncode} after {lines[-1:]}: {r.stderr[-2000:]}")
    return lines, r.stderr.strip().splitlines()[-1]


def test_a_full_chunk_sends_the_checked_op_to_the_python_path():
    # capacity 1: a chunk has room for 65 records (ggml_py adds 64); the checked op refuses once it
    # is full and the Python path opens the next chunk, so a long chain builds all the same
    with gg.Context(capacity=1) as ctx:
        x = ctx.tensor(gg.f32, (4,))
        t = x
        for _ in range(200):
            t = t + x
        assert t.op == "ADD" and t.shape == (4,)
        assert len(ctx.spans()) >= 3 and ctx.n_tensors() == 201   # (65 records a chunk)


@pytest.mark.parametrize("seed", range(4))
def test_checked_ops_give_what_the_python_rules_give(seed):
    (fast, stats), (slow, _) = _run(seed, 1500, True), _run(seed, 1500, False)
    for f, s in zip(fast, slow):
        assert f == s, f"seed {seed}: with the checked ops\n  {f}\nwithout them\n  {s}"
    assert len(fast) == len(slow)
    # the generator reaches both halves of every checked op: some calls built, some refused
    ops = {}
    for line in fast[:-1]:
        _, rest = line.split(" ", 1)
        op, kind = eval(rest, {"nan": float("nan")})[0], eval(rest, {"nan": float("nan")})[1][0]
        ops.setdefault(op, set()).add(kind)
    for op, kinds in ops.items():
        assert kinds == {"ok", "err"}, f"seed {seed}: {op} only gave {kinds}"
    # and every helper both built (the fast path was taken) and refused (the Python path
    # took over): the comparison covers both sides of each helper's rule
    seen = dict(eval(stats))
    for helper in ("binary", "unary", "mul_mat", "norm", "soft_max", "rope", "reshape",
                   "permute", "cont"):
        for built in (True, False):
            assert seen.get((f"ggml_py_{helper}", built), 0) > 0, (
                f"seed {seed}: ggml_py_{helper} never {'built' if built else 'refused'}: {seen}")


def test_the_switch_turns_the_checked_ops_off():
    # without the switch the common case is built in C; with it the Python path builds it,
    # so the comparison above compares two different paths
    code = ("import ggml_py as gg; from ggml_py.ops import _common; "
            "print(_common.CHECKED_OPS is None)")
    for env_value, expect in ((None, "False"), ("1", "True")):
        env = dict(os.environ)
        env.pop("GGML_PY_NO_CHECKED", None)
        if env_value:
            env["GGML_PY_NO_CHECKED"] = env_value
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True).stdout.strip()
        assert out == expect


def test_a_refused_checked_op_takes_no_room_and_builds_nothing():
    with gg.Context(capacity=8) as ctx:
        a = ctx.tensor(gg.f32, (3, 4))
        b = ctx.tensor(gg.i32, (3, 4))
        before = ctx.n_tensors()
        for _ in range(50):             # refused in C, then by the Python rule
            with pytest.raises(gg.InvalidType):
                gg.add(a, b)
        assert ctx.n_tensors() == before
        assert len(ctx.spans()) == 1    # no chunk was opened for refusals
        t = a + a                       # and the common case is built
        assert t.shape == (3, 4) and t.op == "ADD"


def test_checked_ops_build_results_of_the_operands_class(monkeypatch):
    """The checked ops run for operands of the class deriving from TensorBase directly (Tensor)
    and build their result as that class; operands of a subclass take each op's Python path,
    whose results are Tensors of the context. No module names that class to the ops."""
    from ggml_py.ops import elementwise, linalg, nn, shape
    calls = []

    def counting(helper):
        def counted(*args):
            calls.append(helper)
            return helper(*args)
        return counted

    for mod in (elementwise, linalg, nn, shape):
        for name, helper in list(vars(mod).items()):
            if name.startswith("_C_") and helper is not None:
                monkeypatch.setattr(mod, name, counting(helper))

    class Sub(gg.Tensor):
        __slots__ = ()

    ops = {"add": lambda x: gg.add(x, x), "+": lambda x: x + x, "relu": gg.relu,
           "cont": gg.cont, "mul_mat": lambda x: gg.mul_mat(x, x), "norm": gg.norm,
           "soft_max": gg.soft_max, "reshape": lambda x: gg.reshape(x, (16,)),
           "permute": lambda x: gg.permute(x, (1, 0))}
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 4))
        s = Sub(a.ptr, ctx, 2)
        for name, op in ops.items():
            op(a)                       # (permute takes its checked path once it met a perm)
            calls.clear()
            r = op(a)
            assert type(r) is gg.Tensor and len(calls) == 1, name
            calls.clear()
            r = op(s)
            assert type(r) is gg.Tensor and calls == [], name
