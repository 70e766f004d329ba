"""Ownership: idempotent close, closed objects raise, children keep parents alive, weakrefs
die, and create/close cycles do not leak."""
import gc
import weakref

import numpy as np
import pytest

import ggml_py as gg
from conftest import needs_release


def _owned(cpu, rpc_devs):
    yield "buffer", lambda: cpu.buffer_type.alloc(1024)
    yield "backend", lambda: cpu.backend()
    yield "event", lambda: rpc_devs[0].event()
    yield "context", lambda: gg.Context()
    yield "rpc backend", lambda: rpc_devs[0].backend()
    yield "rpc buffer", lambda: rpc_devs[0].buffer_type.alloc(1024)


@needs_release("0.23.0", "events on RPC devices")
def test_weakrefs_die_after_gc(cpu, rpc_devs):
    for what, make in _owned(cpu, rpc_devs):
        obj = make()
        ref = weakref.ref(obj)
        del obj
        gc.collect()
        assert ref() is None, what


@needs_release("0.23.0", "events on RPC devices")
def test_close_is_idempotent_and_closed_objects_raise(cpu, rpc_devs):
    for what, make in _owned(cpu, rpc_devs):
        obj = make()
        obj.close()
        obj.close()
        assert obj.closed
        with pytest.raises(gg.ClosedError, match="closed"):
            obj.ptr
        with pytest.raises(gg.ClosedError, match="closed"):
            with obj:
                pass


@needs_release("0.23.0", "events on RPC devices")
def test_closed_objects_raise_on_use(cpu, rpc_devs):
    be = cpu.backend(); be.close()
    with pytest.raises(gg.ClosedError, match="closed"):
        be.synchronize()
    buf = cpu.buffer_type.alloc(64); buf.close()
    with pytest.raises(gg.ClosedError, match="closed"):
        buf.clear(0)
    ev = rpc_devs[0].event(); ev.close()
    with pytest.raises(gg.ClosedError, match="closed"):
        ev.synchronize()


def test_tensor_keeps_its_context_and_memory_alive(cpu):
    be = cpu.backend()
    ctx = gg.Context()
    t = ctx.tensor(gg.f32, (4,))
    ctx.alloc(be)
    t.set(np.arange(4, dtype=np.float32))
    ref = weakref.ref(ctx)
    del ctx
    gc.collect()
    assert ref() is not None
    assert t.numpy().tolist() == [0, 1, 2, 3]


def test_closing_a_context_closes_its_buffers_and_tensors_raise(cpu):
    with cpu.backend() as be:
        ctx = gg.Context()
        t = ctx.tensor(gg.f32, (4,))
        (buf,) = ctx.alloc(be)
        ctx.close()
        assert buf.closed
        with pytest.raises(gg.ClosedError, match="closed"):
            t.numpy()


def test_zero_copy_view_keeps_memory_alive(cpu):
    with cpu.backend() as be:
        ctx = gg.Context()
        t = ctx.tensor(gg.f32, (1000,))
        ctx.alloc(be)
        t.set(np.full(1000, 2.0, np.float32))
        view = t.numpy()
        assert view.ctypes.data == t.data      # zero copy
        del ctx, t
        gc.collect()
        assert view.sum() == 2000.0


CYCLES = """
import gc, json, psutil, ggml_py as gg
srv = gg.rpc.serve()
cpu, rpc = gg.device("CPU"), gg.rpc.connect(srv.endpoint).devices[0]
proc = psutil.Process()

def growth(make, n=100_000):
    for _ in range(2000):        # warm up allocator pools
        make().close()
    gc.collect()
    before = proc.memory_info().rss
    for _ in range(n):
        make().close()
    gc.collect()
    return proc.memory_info().rss - before

makers = [("buffer", lambda: cpu.buffer_type.alloc(256)), ("backend", cpu.backend)]
if rpc.caps.events:                   # RPC events (ggml 0.23.0+): a round trip each way
    makers.append(("event", rpc.event))
out = {what: growth(make) for what, make in makers}
srv.close()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_create_close_cycles_do_not_grow_rss():
    # In a fresh process: RSS inside the long test session also moves with whatever earlier
    # tests left in the allocator (OpenMP worker threads among them).
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    grown = json.loads(r.stdout.strip().splitlines()[-1])
    for what, n in grown.items():
        assert n < 5 * 2**20, f"{what}: RSS grew by {n / 2**20:.1f} MiB over 100,000 cycles"


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


PROGRAMS = """
import random, sys, numpy as np, ggml_py as gg
seed, n = int(sys.argv[1]), int(sys.argv[2])
be = gg.device("CPU").backend()
counts = {"computed": 0, "recomputed": 0, "refused": 0}
UNARY = [("relu", gg.relu, lambda x: np.maximum(x, 0)), ("neg", lambda t: -t, lambda x: -x),
         ("T", lambda t: gg.cont(gg.transpose(t)), lambda x: x.T),
         ("view", lambda t: gg.transpose(t), lambda x: x.T), ("scale", lambda t: t * 0.5, lambda x: x * 0.5)]
BINARY = [("add", lambda a, b: a + b, np.add), ("mul", lambda a, b: a * b, np.multiply),
          ("matmul", lambda a, b: a @ b, lambda x, y: x @ y),
          ("cpy", lambda a, b: gg.cpy(a, fresh(b)), lambda x, y: x)]
buffers = {}                     # context id -> the buffers its alloc() calls made


def alloc(c):
    buffers.setdefault(id(c), []).extend(c.alloc(be))


def fresh(b):
    # a new allocated tensor in b's context (cpy writes into its destination: a fresh one
    # keeps every other tensor's reference value)
    d = b.ctx.tensor(gg.f32, (4, 4))
    alloc(b.ctx)
    return d


def run(runner, g, out, x, reach, what):
    # compute (or recompute) g: numpy's value, or a refusal that a close explains
    try:
        runner.compute(g)
        got = out.numpy(copy=True)
    except gg.ClosedError:
        assert any(c.closed for c in ctxs if id(c) in reach) or runner.closed, "refused, yet all open"
        counts["refused"] += 1
        return
    except gg.InvalidArgument as e:
        # a buffer closed under a tensor the graph reads: it has no memory
        assert "no memory" in str(e), e
        assert any(id(c) in lost for c in ctxs if id(c) in reach), ("no memory, yet no buffer closed", e)
        counts["refused"] += 1
        return
    assert not any(c.closed for c in ctxs if id(c) in reach), "computed over a closed context"
    if any(id(c) in lost for c in ctxs if id(c) in reach):
        return    # a later alloc() gave a tensor that lost its buffer new, unset memory
    assert np.allclose(got, x, rtol=1e-5, atol=1e-4), (what, got, x)
    counts[what] += 1


for prog in range(n):
    rng = random.Random(seed * 100003 + prog)
    print("PROGRAM", seed, prog, flush=True)
    ctxs, live, graphs, lost = [], [], [], set()   # live: (tensor, reference, contexts reached)
    scheds = [gg.Scheduler([be]) for _ in range(rng.randint(0, 2))]
    for step in range(rng.randint(4, 28)):
        what = rng.choice(["ctx", "input", "input", "unary", "binary", "binary", "close",
                           "closebuf", "graph", "graph", "recompute", "recompute", "read",
                           "reset", "shared", "readgraph"])
        if what == "ctx" or not ctxs:
            ctxs.append(gg.Context(capacity=rng.choice([8, 64, 1024])))
            continue
        if what == "input":
            c = rng.choice(ctxs)
            x = np.asarray(rng.choice([-1.0, 0.5, 2.0]) * np.arange(16, dtype=np.float32).reshape(4, 4) - 3)
            try:
                t = c.from_numpy(x)
                alloc(c)
            except gg.ClosedError:
                assert c.closed
                counts["refused"] += 1
                continue
            live.append((t, x, {id(c)}))
            continue
        if what == "close":
            rng.choice(ctxs + scheds).close()
            continue
        if what == "closebuf":
            bufs = [(cid, b) for cid, bs in buffers.items() for b in bs]
            if bufs:
                cid, b = rng.choice(bufs)
                b.close()
                lost.add(cid)
            continue
        if what == "reset":                # a scheduler hands its placement back
            if scheds:
                sched = rng.choice(scheds)
                try:
                    sched.reset()
                except gg.ClosedError:
                    assert sched.closed
            continue
        if what == "recompute":
            if graphs:
                run(*rng.choice(graphs), "recomputed")
            continue
        if what == "readgraph":            # a graph's structure: refused exactly when closed
            if graphs:
                g = rng.choice(graphs)[1]
                gone = any(c.closed for c in g.contexts)
                try:
                    n = g.n_nodes
                    assert not gone, "read the nodes of a graph whose context closed"
                    assert n >= 1 and len(g.nodes) == n
                except gg.ClosedError:
                    assert gone, "refused, yet all open"
                    counts["refused"] += 1
            continue
        if not live:
            continue
        if what == "unary":
            t, x, reach = rng.choice(live)
            name, f, ref = rng.choice(UNARY)
            try:
                live.append((f(t), ref(x), reach))
            except gg.ClosedError:
                assert any(c.closed for c in ctxs if id(c) in reach), "refused, yet all open"
                counts["refused"] += 1
            except gg.GGMLError as e:       # the op's own rules (strided rows, ...)
                assert "closed" not in str(e), e
        elif what == "binary":
            (a, x, ra), (b, y, rb) = rng.choice(live), rng.choice(live)
            name, f, ref = rng.choice(BINARY)
            reach = ra | ({id(b.ctx)} if name == "cpy" else rb)   # (cpy reads a, writes b's context)
            try:
                live.append((f(a, b), ref(x, y), reach))
            except gg.ClosedError:
                assert any(c.closed for c in ctxs if id(c) in reach), "refused, yet all open"
                counts["refused"] += 1
            except gg.GGMLError as e:       # the op's own rules (strided rows, ...)
                assert "closed" not in str(e), e
        elif what == "shared":           # two graphs sharing a node, on two runners
            t, x, reach = rng.choice(live)
            try:
                u = gg.cont(t) * 2.0
                pair = [(u + 1.0, 2 * x + 1), (u - 1.0, 2 * x - 1)]
                made = [(rng.choice([be] + scheds), gg.Graph(o), o, ref, reach) for o, ref in pair]
            except gg.ClosedError:
                assert any(c.closed for c in ctxs if id(c) in reach), "refused, yet all open"
                counts["refused"] += 1
                continue
            for m in made:
                graphs.append(m)
                run(*m, "computed")
        elif what == "read":
            t, x, reach = rng.choice(live)
            try:
                t.op, t.shape, t.src
            except gg.ClosedError:
                assert any(c.closed for c in ctxs if id(c) in reach)
                counts["refused"] += 1
        else:
            t, x, reach = rng.choice(live)
            try:
                out = gg.cont(t)           # (views are read through a contiguous copy)
                g = gg.Graph(out)
            except gg.ClosedError:
                assert any(c.closed for c in ctxs if id(c) in reach), "refused, yet all open"
                counts["refused"] += 1
                continue
            runner = rng.choice([be] + scheds)
            graphs.append((runner, g, out, x, reach))
            run(runner, g, out, x, reach, "computed")
    for c in scheds + ctxs:
        c.close()
    buffers.clear()
print("COUNTS", counts["computed"], counts["recomputed"], counts["refused"])
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_programs_of_contexts_ops_closes_and_graphs_never_crash(seed):
    # The lifetime class as a generator: random programs over several contexts (inputs, ops
    # across contexts, views, copies, graphs sharing nodes computed and recomputed on a
    # backend or schedulers, reads, scheduler resets, and closes of contexts, buffers and
    # schedulers in any order). Every
    # step either gives numpy's value or is refused, and only when something it reaches was
    # closed (ClosedError, or "no memory" after a buffer closed under it). A child process:
    # a read of freed memory may fault.
    import subprocess
    import sys
    from conftest import child_env
    r = subprocess.run([sys.executable, "-c", PROGRAMS, str(seed), "300"], capture_output=True,
                       text=True, timeout=600, env=child_env())
    last = [line for line in r.stdout.splitlines() if line.startswith("PROGRAM")][-1:]
    assert r.returncode == 0, f"{last}: {r.stderr[-3000:]}"
    computed, recomputed, refused = map(int, r.stdout.strip().splitlines()[-1].split()[1:])
    assert computed > 100 and recomputed > 50 and refused > 50, (computed, recomputed, refused)


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
    from conftest import child_env
    r = subprocess.run([sys.executable, "-c", KEEPS, op, end],
                       capture_output=True, text=True, timeout=120, env=child_env())
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


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
    from conftest import child_env
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
