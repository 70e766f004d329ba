"""Random programs of contexts, ops, closes and graphs: every step computes numpy's value or
is refused, never crashes."""
import pytest


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
    from support import child_env
    r = subprocess.run([sys.executable, "-c", PROGRAMS, str(seed), "300"], capture_output=True,
                       text=True, timeout=600, env=child_env())
    last = [line for line in r.stdout.splitlines() if line.startswith("PROGRAM")][-1:]
    assert r.returncode == 0, f"{last}: {r.stderr[-3000:]}"
    computed, recomputed, refused = map(int, r.stdout.strip().splitlines()[-1].split()[1:])
    assert computed > 100 and recomputed > 50 and refused > 50, (computed, recomputed, refused)
