"""Refusals leak nothing: memory stays flat over thousands of refused calls, and the backend
still computes after them."""

REFUSALS = """
import gc, json, psutil, numpy as np, ggml_py as gg
proc = psutil.Process()
be = gg.device("CPU").backend()
ctx = gg.Context()
a, b, c = ctx.tensor(gg.f32, (4, 8)), ctx.tensor(gg.f32, (3, 5)), ctx.tensor(gg.i32, (4, 8))
ctx.alloc(be)
zctx = gg.Context(); z = zctx.tensor(gg.f32, 4); zctx.close()
bad = [lambda: gg.add(a, b), lambda: gg.relu(c), lambda: a.set(np.ones(3)), lambda: z + z,
       lambda: gg.mul_mat(a, b), lambda: gg.rpc.connect("x:0"), lambda: a.reshape(5, 5),
       lambda: gg.norm(a, -1.0), lambda: gg.relu(a.T), lambda: ctx.tensor(gg.f32, (2.5,)),
       lambda: gg.top_k(a, 99), lambda: gg.device("nope")]

def refuse(n):
    for i in range(n):
        try:
            bad[i % len(bad)]()
        except (gg.GGMLError, LookupError):
            pass
        else:
            raise SystemExit(f"case {i % len(bad)} was accepted")

refuse(2000)                     # warm up
gc.collect()
before = proc.memory_info().rss
refuse(10_000)
gc.collect()
grown = proc.memory_info().rss - before
out = a + a                      # the backend still works
a.set(np.ones((4, 8), np.float32)); be.compute(gg.Graph(out))
print(json.dumps({"grown": grown, "value": float(out.numpy()[0, 0])}))
"""


def test_rss_stays_flat_over_10000_refused_cases():
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", REFUSALS], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["value"] == 2.0
    assert res["grown"] < 2 * 2**20, f"RSS grew by {res['grown'] / 2**20:.1f} MiB over 10,000 refusals"
