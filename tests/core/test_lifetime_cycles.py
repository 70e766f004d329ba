"""Garbage cycles: a __del__ inside a cycle reads what the cycle holds, because every free
waits for the collection to end."""
import pytest

import ggml_py as gg


CYCLE = r"""
import gc, sys, weakref
import numpy as np
import ggml_py as gg
gg.Context.pool_limit(0)          # a chunk given back is freed at once, never kept
kind, mode = sys.argv[1], sys.argv[2]
seen, kept, freed = [], [], []


def counted(fn):
    def free(*args):
        freed.append(fn.__name__)
        return fn(*args)
    return free


from ggml_py import _handle, _record_pool   # every free of the objects below is counted
_handle._release = counted(_handle._release)
_record_pool.release = counted(_record_pool.release)
_record_pool.release_all = counted(_record_pool.release_all)


class Reader:
    # in a cycle of its own; its __del__ reads through the objects its `read` holds, and
    # with mode "resurrect" keeps them (stores `read` in a global: back to life)
    def __init__(self, read):
        self.read, self.me = read, self

    def __del__(self):
        seen.append(self.read())
        if mode != "cycle":
            kept.append(self.read)


def build():
    x = np.arange(16, dtype=np.float32)
    be = gg.device("CPU").backend()
    ctx = gg.Context()
    a = ctx.from_numpy(x)
    out = a * a + a
    [buf] = ctx.alloc(be)
    a.set(x)
    g = gg.Graph(out)
    be.compute(g)
    free = gg.Context()               # tensors the scheduler places
    b = free.from_numpy(x)
    b.set_input()
    sched_out = b * b + b
    sched = gg.Scheduler([be])
    gs = gg.Graph(sched_out)
    sched.alloc(gs)
    b.set(x)
    sched.compute(gs)
    want = (x * x + x).tolist()
    reads = {           # what the __del__ reads, what it must see, what closes it
        "context": (lambda: (out.op, [s.op for s in out.src], out.shape),
                    ("ADD", ["MUL", "NONE"], (16,)), ctx.close),
        "buffer": (lambda: out.numpy(copy=True).tolist(), want, buf.close),
        "graph": (lambda: (g.n_nodes, [n.op for n in g.nodes]), (2, ["MUL", "ADD"]),
                  ctx.close),
        "backend": (lambda: (be.compute(g), out.numpy(copy=True).tolist())[1], want,
                    be.close),
        "scheduler": (lambda: (sched.compute(gs), sched_out.numpy(copy=True).tolist())[1],
                      want, sched.close),
    }
    read, expect, close = reads[kind]
    read.close = close
    Reader(read)            # garbage at once: only its own cycle holds it, and it the rest
    return expect


gc.disable()
pending = len(weakref.finalize._registry)
expect = build()
gc.collect()
assert seen == [expect], (seen, expect)
if mode != "cycle":
    for _ in range(3):                 # kept alive by the global: nothing was freed under it
        gc.collect()
        assert kept[0]() == expect
    if mode == "twice":                # in a cycle again, and brought back again
        Reader(kept.pop())
        gc.collect()
        assert seen == [expect, expect] and len(kept) == 1
        gc.collect()
        assert kept[0]() == expect
    n = len(freed)
    if mode == "close":                # an explicit close frees (or refuses) at once
        kept[0].close()
        assert len(freed) > n, freed
        try:
            kept[0]()
            raise AssertionError("read after close")
        except gg.GGMLError:
            pass
        n = len(freed)
    kept.clear()                       # now it dies for good: what it held is freed
    gc.collect()
    assert len(freed) > n, freed
    assert len(weakref.finalize._registry) == pending, (len(weakref.finalize._registry), pending)
print("ok")
"""


@pytest.mark.parametrize("mode", ["cycle", "resurrect", "twice", "close"])
@pytest.mark.parametrize("kind", ["context", "buffer", "graph", "backend", "scheduler"])
def test_a_del_in_a_cycle_reads_what_the_cycle_holds(kind, mode):
    # the cyclic collector calls the finalizers of its garbage (weakref callbacks) before the
    # __del__ methods of the same garbage: each owned object's memory is freed only when the
    # collection ends (_handle.finalize), so such a __del__ reads records, data, a graph, or
    # computes on a backend or scheduler, that are all still there; and a __del__ that keeps
    # them (resurrects them, once or twice) keeps them usable until they die for good or
    # are closed (which frees at once). With the metadata
    # pool off a freed chunk goes back to the C allocator at once; a child process, since
    # such a read faulted
    import subprocess
    import sys
    from support import child_env
    r = subprocess.run([sys.executable, "-c", CYCLE, kind, mode],
                       capture_output=True, text=True, timeout=120, env=child_env())
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-3000:])


def test_every_finalizer_of_the_package_waits_for_a_collection_to_end():
    # the rule above holds for every owned kind (opt, gguf, events, RPC servers...) because
    # they all free through one function: no other weakref.finalize in the package
    from pathlib import Path
    root = Path(gg.__file__).parent
    found = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py"))
             if p.name != "_finalize.py"
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if "weakref.finalize(" in line]
    assert found == []
