"""Zero-copy exports (numpy views, DLPack) keep their memory whatever closes first."""


EXPORT_ORDERS = """
import gc, itertools, sys, numpy as np, ggml_py as gg
N = 1 << 20        # 4 MiB buffers: freed with munmap, so a read after free faults or misreads
cases = []
for placed in ("alloc", "backend", "scheduler"):
    owners = ["ctx", "backend"] + (["scheduler"] if placed == "scheduler" else [])
    for export in ("numpy", "dlpack"):
        for k in range(len(owners) + 1):
            for order in itertools.permutations(owners, k):
                cases.append((placed, export, order))
for i, (placed, export, order) in enumerate(cases):
    print("CASE", placed, export, order, flush=True)
    be = gg.device("CPU").backend()
    ctx = gg.Context()
    a = ctx.tensor(gg.f32, (N,)); ctx.alloc(be); a.set(np.full(N, i + 1, np.float32))
    out = a + a if placed != "alloc" else a
    sched = None
    if placed == "backend":
        be.compute(gg.Graph(out))
    elif placed == "scheduler":
        sched = gg.Scheduler([be]); sched.compute(gg.Graph(out))
    view = out.numpy(copy=False) if export == "numpy" else np.from_dlpack(out)
    owner = {"ctx": ctx, "backend": be, "scheduler": sched}
    for name in order:
        owner[name].close()
    del a, out, owner, ctx, be, sched       # the rest is collected, not closed
    gc.collect()
    junk = [np.full(N, -1, np.float32) for _ in range(8)]
    want = 2.0 * (i + 1) if placed != "alloc" else float(i + 1)
    assert float(view.min()) == float(view.max()) == want, (view.min(), view.max(), want)
    del view, junk
    gc.collect()
print("ALL", len(cases))
"""


def test_zero_copy_exports_keep_memory_whatever_closes_first():
    # Every placement of a tensor's memory (its context's buffer, a backend's graph
    # allocation, a scheduler's) x both zero-copy exports x every order of closing the
    # objects that own that memory (the rest collected): the export reads what was computed,
    # never freed or reused memory. In a child process: a read after free may fault.
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", EXPORT_ORDERS], capture_output=True, text=True,
                       timeout=300)
    last = [line for line in r.stdout.splitlines() if line.startswith("CASE")][-1:]
    assert r.returncode == 0, f"{last}: {r.stderr[-2000:]}"
    assert r.stdout.strip().splitlines()[-1] == "ALL 52"
