"""This checkout against another one of ggml_py, in one run: graph building, a first Graph, a
recompute, and import time, each side in fresh processes taking turns, on the same ggml build.

    git worktree add /tmp/base <old commit>
    python benchmarks/bench_ab.py /tmp/base [--rounds 6]

A refactor must not make these slower. Each figure is the best of its repeats within a process,
and then the best over the rounds of that side: the machine's load only ever adds time, so the
best is the figure least disturbed by it, and the sides take turns so that a busy minute falls
on both. The ratio is this checkout's best over the other's (below 1: faster). Both sides load the
build GGML_PY_BUILD names (or this checkout's own), so they differ only in Python.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

# run in each side's process; prints "name seconds" lines
PROBE = r"""
import sys, time
t0 = time.perf_counter()
import ggml_py as gg
gg.Context
imported = time.perf_counter() - t0

def best_of(f, n=15):
    b = float("inf")
    for _ in range(n):
        t = time.perf_counter(); f(); b = min(b, time.perf_counter() - t)
    return b

def chain():                       # 2000 checked adds (the one-call fast path)
    ctx = gg.Context(capacity=3000)
    x = ctx.tensor("f32", (16,)); y = x
    for _ in range(2000):
        y = gg.add(y, x)
    ctx.close()

def mixed():                       # mul_mat, transpose, cont and an operator, 300 times each
    ctx = gg.Context(capacity=3000)
    x = ctx.tensor("f32", (16, 16)); y = x
    for _ in range(300):
        y = gg.mul_mat(y, x); y = gg.cont(gg.transpose(y)); y = y * x
    ctx.close()

ctx = gg.Context(capacity=3000)
x = ctx.tensor("f32", (16,)); y = x
for _ in range(1000):
    y = gg.add(y, x)

def graph():                       # a Graph of 1000 nodes, made and dropped
    g = gg.Graph(y)
    del g

cpu = gg.device("CPU").backend(n_threads=1)
ctx.alloc(cpu)
x.set(__import__("numpy").ones(16, "float32"))
g = gg.Graph(y)
cpu.compute(g)

def recompute():                   # the same 1000-node graph computed again
    cpu.compute(g)

print("import", imported)
for name, f in (("chain2000", chain), ("mixed900", mixed), ("graph1000", graph),
                ("recompute1000", recompute)):
    print(name, best_of(f))
"""


# import time alone: a process costs about as much as one import, so each round adds a few
IMPORT_PROBE = PROBE.split("def best_of")[0] + 'print("import", imported)\n'


def run(side: Path, probe: str = PROBE) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(side))
    env.pop("PYTHONDONTWRITEBYTECODE", None)      # imports with bytecode caches, as installed
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         check=True, cwd="/")
    return {k: float(v) for k, v in (ln.split() for ln in out.stdout.splitlines())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", type=Path, help="the other checkout (e.g. a git worktree)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--imports", type=int, default=5, help="import-only processes per side and round")
    a = p.parse_args()
    if "GGML_PY_BUILD" not in os.environ:
        builds = sorted((HERE / "ggml_py" / "lib").glob("ggml-*"))
        if builds:
            os.environ["GGML_PY_BUILD"] = str(builds[0])
    sides = {"base": a.base.resolve(), "this": HERE}
    for s in sides.values():                      # a first import writes the bytecode caches
        run(s)
    best: dict[str, dict[str, float]] = {k: {} for k in sides}
    for r in range(a.rounds):
        order = list(sides.items())
        for k, s in order if r % 2 else order[::-1]:       # who goes first alternates
            for probe in [PROBE] + [IMPORT_PROBE] * a.imports:
                for name, v in run(s, probe).items():
                    best[k][name] = min(best[k].get(name, float("inf")), v)
        print(f"round {r + 1}/{a.rounds} done", flush=True)
    rev = {k: subprocess.run(["git", "-C", str(s), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip() for k, s in sides.items()}
    print(f"\nbest of {a.rounds} rounds ({1 + a.imports} imports each), base {rev['base']} vs this {rev['this']} "
          f"(build {os.environ.get('GGML_PY_BUILD', '?')})")
    for name in best["this"]:
        b, t = best["base"][name], best["this"][name]
        unit, f = ("ms", 1e3) if name == "import" else ("us", 1e6)
        print(f"  {name:14s} base {b * f:9.1f} {unit}  this {t * f:9.1f} {unit}  ratio {t / b:.3f}")


if __name__ == "__main__":
    main()
