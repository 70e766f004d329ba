"""A result keeps alive every context it reads, whether those contexts are dropped or
closed."""
import pytest


# -- a result keeps alive every context it reads ------------------------------------------------
KEEPS = r"""
import gc, sys, numpy as np, ggml_py as gg
op, end = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(5)
f = lambda *s: rng.standard_normal(s).astype(np.float32)
# (numpy values of the two operands, the op on tensors, the reference on arrays)
OPS = {
    "add": ((f(4, 8), f(4, 8)), gg.add, np.add),
    "mul": ((f(4, 8), f(8)), gg.mul, np.multiply),
    "+": ((f(4, 8), f(4, 8)), lambda a, b: a + b, np.add),
    "*": ((f(2, 4, 8), f(4, 8)), lambda a, b: a * b, np.multiply),
    "mul_mat": ((f(6, 8), f(5, 8)), gg.mul_mat, lambda a, b: b @ a.T),
    "@": ((f(5, 8), f(8, 6)), lambda a, b: a @ b, np.matmul),
    "soft_max": ((f(4, 8), f(4, 8)), lambda a, m: gg.soft_max(a, m, 0.5),
                 lambda a, m: np.exp(0.5 * a + m) / np.exp(0.5 * a + m).sum(-1, keepdims=True)),
    "cpy": ((f(4, 8), f(4, 8)), gg.cpy, lambda a, b: a),
    "rope_ext": ((f(3, 2, 8), np.array([0, 3, 7], np.int32)), gg.rope_ext, None),
}


def rope(x, pos):                  # GGML_ROPE_TYPE_NORMAL: adjacent pairs, base 10000
    d = x.shape[-1]
    theta = pos[:, None, None] * 10000.0 ** (-np.arange(0, d, 2) / d)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * np.cos(theta) - x1 * np.sin(theta)
    out[..., 1::2] = x0 * np.sin(theta) + x1 * np.cos(theta)
    return out

(x, y), fn, ref = OPS[op]
ref = ref or rope
be = gg.device("CPU").backend()
ca, cb = gg.Context(capacity=16), gg.Context(capacity=16)
a, b = ca.from_numpy(x), cb.from_numpy(y)
ca.alloc(be); cb.alloc(be)
c = fn(a, b)
owner = c.ctx
assert owner is ca or owner is cb
shapes = [s.shape for s in c.src]
other = cb if owner is ca else ca
if end == "close":                # the other context closed: computing c is refused
    other.close()
    try:
        be.compute(gg.Graph(c))
        raise AssertionError("computed over a closed context")
    except gg.ClosedError:
        print("ok")
        sys.exit(0)
# drop every reference to the other context and its tensors: only c's own books keep it
del a, b, other, ca, cb
gc.collect()
# fresh contexts of the same size take any chunk given back, and fill it with other records
churn = [gg.Context(capacity=16) for _ in range(8)]
for k in churn:
    for _ in range(12):
        k.tensor(gg.i32, (3,))
assert [s.shape for s in c.src] == shapes
be.compute(gg.Graph(c))
want = ref(x, y)
assert np.allclose(c.numpy(), want, rtol=1e-4, atol=1e-5), (c.numpy(), want)
print("ok")
"""


@pytest.mark.parametrize("end", ["drop", "close"])
@pytest.mark.parametrize("op", ["add", "mul", "+", "*", "mul_mat", "@", "soft_max", "cpy",
                                "rope_ext"])
def test_a_result_keeps_alive_every_context_it_reads(op, end):
    # an op whose operands live in two contexts: dropping the other one (no close) leaves the
    # result's own context keeping it, so its records and memory are never given back (with
    # the metadata pool, a chunk given back too early is at once reused by the next context,
    # and the result's sources would read other records). A child process: such a read may
    # fault
    import subprocess
    import sys
    from support import child_env
    r = subprocess.run([sys.executable, "-c", KEEPS, op, end],
                       capture_output=True, text=True, timeout=120, env=child_env())
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
