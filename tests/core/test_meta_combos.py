"""Every split combination of the probed ops (tests/support/meta_probe.py), and random draws of shapes
and splits over two and three devices: what ggml_py's plan accepts computes the numpy result in
ggml, what it refuses ggml aborts on or computes wrong. Each case runs in a child process (ggml
aborts the process on what it does not implement)."""
import random

import pytest

import ggml_py as gg
from support.meta_models import meta_supported
from support.meta_probe import OPS, all_cases, probe

pytestmark = pytest.mark.skipif(not meta_supported(),
                                reason="ggml_py offers meta devices from ggml 0.26.0")


def _agree(cases, results):
    bad = []
    for c, r in zip(cases, results):
        accepted = r["plan"] == "accepted"
        if accepted != (r["ggml"] == "ok"):
            bad.append((c, r))
        if not accepted:
            assert r["plan"].startswith("refused") and "meta device:" in r["plan"], r
    assert not bad, bad


def test_every_split_of_every_probed_op():
    cases = all_cases()
    results = probe(cases)
    _agree(cases, results)
    # the facts docs/tensor-parallel.md states
    by = {(c["op"], tuple(c["splits"])): r for c, r in zip(cases, results)}
    assert by[("mul_mat", (-2, "M"))]["ggml"] == "ok"            # column parallel
    assert by[("mul_mat", (-1, -1))]["ggml"] == "ok"             # row parallel, reduced
    assert by[("soft_max", (-1,))]["ggml"] == "wrong"            # upstream: wrong result
    assert by[("mul_mat", (-1, "M"))]["ggml"] == "abort"


def draw(rnd, n_dev):
    op = rnd.choice(sorted(OPS))
    n = OPS[op][0]
    rows, cols = rnd.choice([2, 3, 4, 5, 6, 9]), rnd.choice([4, 6, 8, 10, 12])
    if op == "mul_mat":
        shapes = [[rows, cols], [rnd.choice([1, 2, 3, 4]), cols]]
    else:
        shapes = [[rows, cols]] * n
    return {"op": op, "shapes": shapes,
            "splits": [rnd.choice(["M", "M", "P", -1, -2]) for _ in range(n)]}


@pytest.mark.parametrize("n_dev", [2, 3])
def test_random_draws(n_dev):
    """Uneven sizes (odd rows, three devices) included: ggml's ratio rules decide there."""
    rnd = random.Random(1000 + n_dev)
    cases = [draw(rnd, n_dev) for _ in range(40)]
    _agree(cases, probe(cases, devices=("CPU",) * n_dev))
