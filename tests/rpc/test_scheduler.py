"""The scheduler: splitting a graph over CPU and two RPC devices, reserve, pins, async and
parallel computes, contexts closed under it, and inputs it allocates the llama.cpp way."""
import numpy as np
import pytest

import ggml_py as gg
from support import LayerStack, needs_release, nmse

T_MATMUL = 5e-4


@needs_release("0.23.0", "an RPC server that survives this graph (0.20.2's aborts)")
def test_scheduler_splits_across_cpu_and_two_rpc_devices(cpu, rpc_devs, rng):
    bes = [rpc_devs[0].backend(), rpc_devs[1].backend(), cpu.backend()]
    stack = LayerStack(bes, bes[2], rng)          # layer i's weights on backend i
    with gg.Scheduler(bes) as sched:
        sched.compute(gg.Graph(stack.out))
        assert sched.n_splits >= 2
        assert nmse(stack.out.numpy(copy=True), stack.ref) < T_MATMUL
    with pytest.raises(gg.InvalidArgument, match="no memory"):
        stack.out.numpy()  # its memory went with the scheduler: it says so, no dangling read
    stack.close()
    for b in bes:
        b.close()


def test_scheduler_result_equals_cpu_alone(cpu, rpc_devs, rng):
    x = rng.standard_normal((16, 16)).astype(np.float32)
    results = []
    for devs in ([cpu], [rpc_devs[0], rpc_devs[1], cpu]):
        bes = [d.backend() for d in devs]
        with gg.Context() as ctx, gg.Scheduler(bes) as sched:
            a = ctx.from_numpy(x)
            ctx.alloc(bes[-1])
            a.set(x)
            out = gg.soft_max(a @ a) + a
            sched.compute(gg.Graph(out))
            results.append(out.numpy(copy=True))
        for b in bes:
            b.close()
    assert nmse(results[1], results[0]) < 1e-10



def test_scheduler_reserve_pin_async_and_parallel(cpu, rpc_devs, rng):
    x = rng.standard_normal((16, 16)).astype(np.float32)
    rb, cb = rpc_devs[0].backend(), cpu.backend()
    with gg.Context() as ctx:
        a = ctx.from_numpy(x)
        ctx.alloc(cb)
        a.set(x)
        mid = gg.relu(a @ a)
        out = gg.soft_max(mid) + a
        g = gg.Graph(out)
        with gg.Scheduler([rb, cb]) as sched:
            sched.reserve(g)
            assert sched.buffer_size(cb) > 0
            sched.compute(g)
            assert sched.n_splits == 1 and sched.backend_of(mid) is cb   # all on the CPU
            first = out.numpy(copy=True)
            sched.set_backend(mid, rb)                 # pin one node to the RPC device
            sched.compute_async(g)
            sched.synchronize()
            assert sched.backend_of(mid) is rb             # (ggml may move its neighbours too)
            assert nmse(out.numpy(copy=True), first) < 1e-10
            sched.reset()                              # drops the pin (and the placement)
            sched.set_backend(mid, cb)
            sched.compute(g)
            assert sched.backend_of(mid) is cb
            assert nmse(out.numpy(copy=True), first) < 1e-10
        with gg.Scheduler([rb, cb], parallel=True) as par:
            par.compute(g)
            assert par.n_copies > 1                    # pipeline-parallel copies of the inputs
            assert nmse(out.numpy(copy=True), first) < 1e-10
        # ggml's scheduler rewires split nodes to copies it frees later; the graph comes back
        # whole, so a plain backend can compute it after the schedulers are gone
        cb.compute(g)
        assert nmse(out.numpy(copy=True), first) < 1e-10
        with pytest.raises(gg.InvalidArgument, match="not one of"):
            gg.Scheduler([cb]).set_backend(mid, rb)
    rb.close()
    cb.close()


def test_closing_a_context_before_the_scheduler_is_safe(cpu, rpc_devs, rng):
    """Nodes of one graph live in several contexts (a result goes to its first operand's);
    closing one of them while a scheduler holds the graph must not leave ggml writing or
    reading freed memory."""
    bes = [rpc_devs[0].backend(), cpu.backend()]
    stack = LayerStack(bes, bes[1], rng)
    sched = gg.Scheduler(bes)
    g = gg.Graph(stack.out)
    sched.compute(g)
    stack.ctxs[0].close()                # the RPC weights' context, with nodes of the graph
    with pytest.raises(gg.ClosedError, match="context"):
        sched.compute(g)
    with pytest.raises(gg.ClosedError, match="closed"):
        bes[1].compute(g)
    sched.close()
    stack.close()
    for b in bes:
        b.close()


def test_scheduler_allocates_inputs_the_llama_cpp_way(cpu, rpc_devs, rng):
    """Inputs created without memory and marked as inputs are placed by the scheduler:
    alloc(graph), set them, compute(graph). Unmarked ones, or computing before they were
    set, raise instead of computing on garbage."""
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    rb, cb = rpc_devs[0].backend(), cpu.backend()
    wctx, ictx = gg.Context(), gg.Context()
    wt = wctx.from_numpy(w)
    wctx.alloc(rb)                                   # weights live on the RPC device
    inp = ictx.tensor(gg.f32, x.shape, "inp")        # no memory of its own
    out = gg.tanh(inp @ wt)
    g = gg.Graph(out)
    with gg.Scheduler([rb, cb]) as sched:
        with pytest.raises(gg.InvalidArgument, match="mark it t.set_input"):
            sched.alloc(g)
        inp.set_input()
        with pytest.raises(gg.InvalidArgument, match="call sched.alloc"):
            sched.compute(g)
        sched.alloc(g)
        inp.set(x)
        sched.compute(g)
        assert nmse(out.numpy(copy=True), np.tanh(x @ w)) < T_MATMUL
    with pytest.raises(gg.InvalidArgument, match="no memory"):
        inp.numpy()                                  # its memory went with the scheduler
    wctx.close(); ictx.close(); rb.close(); cb.close()



FOLLOW_UPS = ["src", "new graph on the CPU", "same graph on the CPU", "another scheduler",
              "same scheduler again", "close the scheduler", "reset the scheduler"]


@pytest.mark.parametrize("first", ["compute", "reserve", "alloc"])
@pytest.mark.parametrize("steps", [(a, b) for a in FOLLOW_UPS for b in FOLLOW_UPS])
def test_split_nodes_keep_their_own_sources(cpu, rpc_devs, first, steps):
    """ggml's scheduler points the sources of split nodes at copies of its own until its next
    split (and frees them with itself). Whatever follows a split, in any order of two steps:
    Tensor.src gives the node's own operands, new graphs and other computes walk those (never a
    freed or stale copy), and every compute gives the CPU's result."""
    cpu_be, rpc_be = cpu.backend(), rpc_devs[0].backend()
    ctx = gg.Context()
    a, b = ctx.tensor(gg.f32, (4, 4)), ctx.tensor(gg.f32, (4, 4))
    ctx.alloc(cpu_be)
    a.set(np.arange(16, dtype=np.float32).reshape(4, 4)); b.set(np.ones((4, 4), np.float32))
    x = gg.mul_mat(a, b)
    y = x + a
    z = gg.relu(y)
    av = np.arange(16, dtype=np.float32).reshape(4, 4)
    ref = np.maximum(np.ones((4, 4)) @ av.T + av, 0)      # ggml's mul_mat(a, b) is b @ a.T
    own = {id(x): [a, b], id(y): [x, a], id(z): [y]}
    scheds = [gg.Scheduler([rpc_be, cpu_be])]
    scheds[0].set_backend(x, rpc_be)
    g = gg.Graph(z)
    getattr(scheds[0], first)(g)

    def check_sources():
        for t in (x, y, z):
            got = t.src
            assert len(got) == len(own[id(t)])
            for s, want in zip(got, own[id(t)]):
                assert s.ptr == want.ptr and s.shape == want.shape == (4, 4)

    check_sources()
    for step in steps:
        if step == "src":
            check_sources()
        elif step in ("new graph on the CPU", "same graph on the CPU"):
            w = z * 2 if step.startswith("new") else z
            try:
                cpu_be.compute(gg.Graph(w) if step.startswith("new") else g)
            except gg.InvalidArgument as e:
                # x still lives where the scheduler placed it, on RPC0: a clean refusal
                assert "cannot use" in str(e)
            else:
                np.testing.assert_allclose(w.numpy(), ref * (2 if step.startswith("new") else 1))
        elif step == "another scheduler":
            s2 = gg.Scheduler([rpc_be, cpu_be])
            scheds.append(s2)
            s2.set_backend(y, rpc_be)
            try:
                s2.compute(g)
            except gg.InvalidArgument as e:
                # y has memory on the CPU from another graph's allocation: a clean refusal
                assert "cannot use" in str(e)
            else:
                np.testing.assert_allclose(z.numpy(), ref)
        elif step == "same scheduler again":
            if not scheds[0].closed:
                try:
                    scheds[0].compute(g)
                except gg.InvalidArgument as e:
                    assert "cannot use" in str(e)
                else:
                    np.testing.assert_allclose(z.numpy(), ref)
        elif step == "close the scheduler":
            scheds[0].close()
        elif step == "reset the scheduler":
            if not scheds[0].closed:
                scheds[0].reset()
        check_sources()
    for s in scheds:
        s.close()
    check_sources()
    cpu_be.compute(g)
    np.testing.assert_allclose(z.numpy(), ref)
    ctx.close()


def test_a_split_graph_dropped_without_close_is_collected(cpu, rpc_devs):
    """The record of split nodes lives on the graph's contexts, not in a global: a context, its
    graph and the scheduler that split it, dropped without close(), are collected."""
    import gc
    import weakref
    cpu_be, rpc_be = cpu.backend(), rpc_devs[0].backend()
    refs = []
    for _ in range(3):
        ctx = gg.Context()
        a = ctx.tensor(gg.f32, (4, 4))
        ctx.alloc(cpu_be)
        a.set(np.ones((4, 4), np.float32))
        x = gg.mul_mat(a, a)
        out = x + a
        sched = gg.Scheduler([rpc_be, cpu_be])
        sched.set_backend(x, rpc_be)
        sched.compute(gg.Graph(out))
        assert ctx.rewired and out.numpy()[0, 0] == 5.0      # split: x on RPC0, the add on the CPU
        refs += [weakref.ref(ctx), weakref.ref(sched)]
        del ctx, a, x, out, sched
    gc.collect()
    assert all(r() is None for r in refs)
    cpu_be.close()
    rpc_be.close()


def test_memory_handed_back_under_prepared_graphs_is_placed_again_or_refused(cpu):
    # A graph validated for a backend recomputes without checks only while nothing closed
    # or was handed back since: a scheduler's reset under a node another graph shares, or a
    # buffer closed under a leaf, used to send ggml into NULL or freed memory (segfault, or a
    # corrupted heap once the allocator placed the graph again over its own old nodes).
    with cpu.backend() as be, gg.Context() as ctx:
        a = ctx.from_numpy(np.ones(1 << 12, np.float32))
        (buf,) = ctx.alloc(be)
        mid = a * 2.0
        g1, g2 = gg.Graph(mid + 1.0), gg.Graph(mid + 3.0)
        with gg.Scheduler([be]) as sched:
            sched.compute(g1)                   # the scheduler places mid
            be.compute(g2)
            be.compute(g2)                      # (the fast path)
            sched.reset()                       # mid loses its memory
            be.compute(g2)                      # placed again by g2's allocator
            assert g2.outputs[0].numpy()[0] == 5.0
            sched.compute(g1)
            be.compute(g2)
            assert g1.outputs[0].numpy()[0] == 3.0 and g2.outputs[0].numpy()[0] == 5.0
            buf.close()                         # a's memory goes
            for run in (lambda: be.compute(g2), lambda: sched.compute(g1)):
                with pytest.raises(gg.InvalidArgument, match="no memory"):
                    run()


OPS_SAME_SIZE = [   # (name, op on a tensor, the same on numpy): each keeps a 4x4 f32 shape
    ("add", lambda t: t + t, lambda x: x + x),
    ("transpose", gg.transpose, lambda x: x.T),
    ("cont", gg.cont, lambda x: x),
    ("scale", lambda t: t * 0.5, lambda x: x * 0.5),
    ("neg", lambda t: -t, lambda x: -x),
    ("relu", gg.relu, lambda x: np.maximum(x, 0)),
]


@pytest.mark.parametrize("seed", range(16))
def test_one_scheduler_places_every_new_graph_afresh(cpu, seed):
    # ggml's allocator reuses the offsets it chose for the last graph whenever the next one
    # has as many nodes and leafs and its tensors fit, without comparing how they connect:
    # after one 3-node graph, add -> transpose -> cont put the cont on the memory its
    # transposed source still held. Generated: graphs of one node count made of random ops
    # (views among them) over one input, computed in turn on one scheduler, each against numpy.
    import random
    rng = random.Random(seed)
    x = (np.arange(16, dtype=np.float32).reshape(4, 4) - 5) * rng.choice([1.0, -0.5])
    n_ops = rng.choice([2, 3, 4])
    with gg.Context() as ctx, cpu.backend() as be, gg.Scheduler([be]) as sched:
        a = ctx.from_numpy(x)
        ctx.alloc(be)
        graphs = []
        for _ in range(8):
            t, ref, names = a, x, []
            for _ in range(n_ops):
                name, f, g = rng.choice(OPS_SAME_SIZE)
                try:
                    t, ref = f(t), g(ref)
                except gg.InvalidArgument:        # (strided rows refused: a copy instead,
                    t, name = gg.cont(t), "cont"  # one node all the same)
                names.append(name)
            out = gg.cont(t)                      # (a view at the end is read through a copy)
            graphs.append((gg.Graph(out), out, ref, names))
        for _ in range(24):
            g, out, ref, names = rng.choice(graphs)
            sched.compute(g)
            assert np.array_equal(out.numpy(), ref), names


@needs_release("0.23.0", "an RPC server that survives this graph (0.20.2's aborts)")
def test_one_scheduler_takes_split_graphs_in_turn(cpu, rpc_devs, rng):
    # The same rule where graphs split over backends: measuring a new graph splits it too
    # (sources rewired to the scheduler's copies, pins reset), and what it rewired is put back
    # before the real placement. Stacks of one and of another node count, computed in turn.
    bes = [rpc_devs[0].backend(), rpc_devs[1].backend(), cpu.backend()]
    b0, b1, bc = bes
    stacks = [LayerStack([b0, b1], bc, rng), LayerStack([b1, b0], bc, rng),
              LayerStack([b1, b0, b1], bc, rng), LayerStack([bc, b0], b1, rng)]
    graphs = [gg.Graph(s.out) for s in stacks]
    with gg.Scheduler(bes) as sched:
        for i in (0, 1, 2, 0, 3, 1, 3, 2, 0):
            sched.compute(graphs[i])
            assert sched.n_splits >= 2
            assert nmse(stacks[i].out.numpy(copy=True), stacks[i].ref) < T_MATMUL, i
    for s in stacks:
        s.close()
    for b in bes:
        b.close()
