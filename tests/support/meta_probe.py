"""What ggml's meta backend does with a split combination, found in child processes (it aborts
the process on what it does not implement), set beside what ggml_py's plan says.

A case is (op, shapes, splits): numpy shapes of the operands, one split per operand
("M" mirrored, "P" partial, or a numpy axis as an int). The child builds the op on a meta
device over two devices, bypasses ggml_py's checks (the raw compute and read), adds a reducing
op after a PARTIAL result (ggml never reads one), and prints the NMSE against numpy; a case
that aborts leaves its "start" line without a result. ``python tests/support/meta_probe.py`` prints the
table for docs/tensor-parallel.md.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

OPS = {
    # name: (number of operands, numpy reference)
    "mul_mat": (2, lambda a, b: b @ np.swapaxes(a, -1, -2)),
    "add": (2, lambda a, b: a + b),
    "mul": (2, lambda a, b: a * b),
    "relu": (1, lambda a: np.maximum(a, 0)),
    "scale": (1, lambda a: a * 2.0),
    "rms_norm": (1, lambda a: a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6)),
    "soft_max": (1, lambda a: np.exp(a - a.max(-1, keepdims=True)) /
                 np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True)),
    "sum_rows": (1, lambda a: a.sum(-1, keepdims=True)),
    "transpose_cont": (1, lambda a: np.swapaxes(a, -1, -2).copy()),
    "reshape_flat": (1, lambda a: a.reshape(-1)),
}


def _split(gg, s):
    return gg.Split.MIRRORED if s == "M" else gg.Split.PARTIAL if s == "P" else gg.Split(axis=s)


def _build(gg, op, ts):
    f = getattr(gg, op, None)
    if op == "transpose_cont":
        return gg.cont(gg.transpose(ts[0]))
    if op == "reshape_flat":
        return gg.reshape(ts[0], (-1,))
    if op == "scale":
        return gg.scale(ts[0], 2.0)
    return f(*ts)


def _child(cases, devices):
    import ggml_py as gg
    from ggml_py import _meta
    from ggml_py._backend import Backend
    from ggml_py._loader import ffi, lib
    devs = [gg.device(d) for d in devices]
    for i, case in enumerate(cases):
        print(json.dumps({"start": i}), flush=True)
        op, shapes, splits = case["op"], case["shapes"], case["splits"]
        rng = np.random.default_rng(i)
        arrs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        names = [f"in{k}" for k in range(len(shapes))]
        md = gg.meta_device(devs, {n: _split(gg, s) for n, s in zip(names, splits)})
        verdict = "accepted"
        with md.backend() as be, gg.Context() as ctx:
            ts = [ctx.from_numpy(a, n) for a, n in zip(arrs, names)]
            try:
                ctx.alloc(be)
                for t, a, s in zip(ts, arrs, splits):
                    if s == "P":       # ggml divides what is written among the devices
                        t.set(a)
                    else:
                        t.set(a)
                y = _build(gg, op, ts)
                try:        # a PARTIAL result is read after a reducing op (ggml reads no other)
                    partial = _meta.plan_tensor(y.ptr).axis == _meta.PARTIAL
                except gg.GGMLError:
                    partial = False
                out = gg.meta_reduce(y) if partial else y
                g = gg.Graph(out)
                try:
                    _meta.plan(g, be)
                except gg.GGMLError as e:
                    verdict = f"refused: {e}"
                if os.environ.get("META_PROBE_DEBUG"):
                    print(_meta.split_states(g, be), out.shape, flush=True)
                print(json.dumps({"plan": i, "verdict": verdict}), flush=True)
                if verdict != "accepted":
                    # the plan refused it: what does ggml do? (the raw path, no checks)
                    g.prepare(be)
                Backend.compute(be, g)
                got = np.empty(out.shape, np.float32)
                lib.ggml_backend_tensor_get(out.ptr, ffi.from_buffer("void *", got), 0, got.nbytes)
            except gg.GGMLError as e:
                print(json.dumps({"done": i, "verdict": f"refused before compute: {e}",
                                  "nmse": None}), flush=True)
                continue
        ref = OPS[op][1](*arrs)
        den = float(np.sum(ref.astype(np.float64) ** 2)) or 1.0
        err = float(np.sum((got.astype(np.float64) - ref.reshape(got.shape)) ** 2) / den)
        print(json.dumps({"done": i, "verdict": verdict, "nmse": err}), flush=True)


def probe(cases, devices=("CPU", "CPU"), timeout=120):
    """Run `cases` in child processes; per case a dict with the plan's verdict and ggml's
    outcome: 'ok' (NMSE < 1e-6), 'wrong' (it computed something else) or 'abort'."""
    results: list = [None] * len(cases)
    todo = list(range(len(cases)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), str(ROOT / "tests" / "support")] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    while todo:
        batch = [cases[i] for i in todo]
        p = subprocess.run([sys.executable, "-c",
                            "import sys, json; from meta_probe import _child; "
                            "_child(json.loads(sys.stdin.read()), sys.argv[1:])", *devices],
                           input=json.dumps(batch), capture_output=True, text=True,
                           timeout=timeout, env=env)
        started, planned = None, "not planned"
        for line in p.stdout.splitlines():
            if not line.startswith("{"):
                continue
            m = json.loads(line)
            if "start" in m:
                started, planned = m["start"], "not planned"
            elif "plan" in m:
                planned = m["verdict"]
            else:
                k = todo[m["done"]]
                nm = m["nmse"]
                outcome = "refused before compute" if nm is None else \
                    "ok" if nm < 1e-6 else "wrong"
                results[k] = {"plan": m["verdict"], "ggml": outcome, "nmse": nm}
                started = None
        if started is None:
            if any(results[k] is None for k in todo):
                raise RuntimeError(f"probe child failed: {p.stderr[-2000:]}")
            break
        k = todo[started]
        err = [ln for ln in p.stderr.splitlines() if "error" in ln.lower() or "ASSERT" in ln]
        results[k] = {"plan": planned, "ggml": "abort", "nmse": None,
                      "abort": (err[-1] if err else p.stderr[-300:]).strip(),
                      "rc": p.returncode}
        todo = todo[started + 1:]
    return results


def all_cases():
    """Every split of every operand for each op in OPS (2-d operands, even sizes)."""
    cases = []
    for op, (n, _) in OPS.items():
        choices = ["M", "P", -1, -2]
        if n == 1:
            for s in choices:
                cases.append({"op": op, "shapes": [[6, 8]], "splits": [s]})
        else:
            for s0 in choices:
                for s1 in choices:
                    shapes = [[6, 8], [4, 8]] if op == "mul_mat" else [[6, 8], [6, 8]]
                    cases.append({"op": op, "shapes": shapes, "splits": [s0, s1]})
    return cases


if __name__ == "__main__":
    cs = all_cases()
    for c, r in zip(cs, probe(cs)):
        plan = "accepted" if r["plan"] == "accepted" else "refused"
        print(f"| {c['op']} | {', '.join(map(str, c['splits']))} | {plan} | {r['ggml']} |"
              f" {r.get('abort', '') or (r['nmse'] if r['nmse'] is not None else '')} |")
