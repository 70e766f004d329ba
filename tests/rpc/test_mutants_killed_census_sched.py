"""Tests written against survivors of the census of every mutant (docs/mutation.md): the
scheduler's check of where ggml placed each node (Scheduler._check_placed_backends). Each fails
when its mutant is applied and passes without.

A node that already has memory (a context allocated it after the op was built) stays where it
is; ggml runs it, in place, on the backend it was pinned to, and does not ask whether that
backend can use the memory. The scheduler refuses it by name: the node (or its op, unnamed),
the buffer type of its memory and the backend. The refusals are reached with sched.alloc, so a
mutant that lets one through computes nothing (no garbage written, no server hurt).

The other refusal of that method (ggml placed on an RPC backend an op its server's backend
lacks) is not reachable in this build: the check before placing already refuses a graph whose
op the local CPU cannot run, and the CPU's answer for a node cannot change between the two
checks (see the test at the end)."""
import re

import numpy as np
import pytest

import ggml_py as gg

X = np.arange(8, dtype=np.float32) - 4


def _node_with_memory_on(cb, where):
    """(context, a, y): `a` an input with values on the CPU, y = relu(a) a node of the same
    context given memory by ``ctx.alloc(where)`` (after `a` had its own)."""
    ctx = gg.Context()
    a = ctx.tensor(gg.f32, X.shape, "a")
    ctx.alloc(cb)
    a.set(X)
    y = gg.relu(a)
    y.name = "y"
    ctx.alloc(where)
    assert y.is_allocated
    return ctx, a, y


def _name(name):
    """A pattern for ggml's own name of a backend or buffer type called `name` by ggml_py:
    "CPU" as is; an RPC one "RPC<i>[host:port]" ("RPC[host:port]" in ggml 0.9.x), where ggml
    numbers the devices of each server from 0 and ggml_py names them after its own devices
    (RPC0, RPC1, ... across servers)."""
    if "[" not in name:
        return re.escape(name)
    return r"RPC\d*" + re.escape(name[name.index("["):])


def _refusal(node, buft, backend):
    return (re.escape(f"scheduler: node {node!r} already has memory in a ") + _name(buft) +
            re.escape(" buffer (placed by another graph's allocation), which backend ") +
            _name(backend) + re.escape(", where the scheduler runs it, cannot use"))


def test_a_node_with_cpu_memory_pinned_to_an_rpc_backend_is_refused_by_name(cpu, rpc_devs):
    """Rule: a node with memory of its own, pinned to a backend that cannot use that memory, is
    refused when placed, naming the node, the buffer type (CPU) and the backend (the RPC one);
    pinned to a backend that can, it computes."""
    with cpu.backend() as cb, rpc_devs[0].backend() as rb:
        ctx, _, y = _node_with_memory_on(cb, cb)
        g = gg.Graph(y)
        with gg.Scheduler([rb, cb]) as sched:
            sched.set_backend(y, rb)
            with pytest.raises(gg.InvalidArgument, match=_refusal("y", "CPU", rb.name)):
                sched.alloc(g)
            sched.reset()
            sched.set_backend(y, cb)
            sched.compute(g)
            assert sched.backend_of(y) is cb
            np.testing.assert_array_equal(y.numpy(), np.maximum(X, 0))
        ctx.close()


@pytest.mark.parametrize("pin", ["cpu", "other rpc"])
def test_a_node_with_memory_on_one_server_pinned_elsewhere_is_refused_by_name(cpu, rpc_devs,
                                                                              pin):
    """Rule: memory in one RPC server's buffer, scheduler of CPU and another server's backend:
    no backend of the scheduler can use that memory, so wherever the node is pinned the graph
    is refused before ggml places it (Scheduler._check_memory_usable), naming that server's
    buffer type."""
    with cpu.backend() as cb, rpc_devs[0].backend() as r0, rpc_devs[1].backend() as r1:
        ctx, _, y = _node_with_memory_on(cb, r0)
        buft = r0.default_buffer_type.name
        assert y.buffer.buffer_type.name == buft
        to = cb if pin == "cpu" else r1
        with gg.Scheduler([r1, cb]) as sched:
            sched.set_backend(y, to)
            with pytest.raises(gg.InvalidArgument, match=re.escape(
                    f"scheduler: 'y' (RELU) has memory in a {buft} buffer, which no backend "
                    f"of {[r1.name, cb.name]} can use for it")):
                sched.alloc(gg.Graph(y))
        ctx.close()


def test_an_unnamed_node_is_refused_by_its_op(cpu, rpc_devs):
    """Rule: the refusal names a node without a name by its op (RELU here)."""
    with cpu.backend() as cb, rpc_devs[0].backend() as rb:
        ctx, _, y = _node_with_memory_on(cb, cb)
        g = gg.Graph(y)                 # (ggml names unnamed nodes node_<i> when building it)
        y.name = ""
        with gg.Scheduler([rb, cb]) as sched:
            sched.set_backend(y, rb)
            with pytest.raises(gg.InvalidArgument, match=_refusal("RELU", "CPU", rb.name)):
                sched.alloc(g)
        ctx.close()


def test_an_op_no_backend_can_run_is_refused_before_ggml_places_it(cpu, rpc_devs):
    """Rule: an op the CPU cannot run (CPY to IQ2_XXS) is refused before placing, for any
    scheduler: ggml's RPC client answers yes to every op, so the refusal after placing (an op
    on an RPC backend its server cannot run) never sees one, pinned or not."""
    with cpu.backend() as cb, rpc_devs[0].backend() as rb:
        ctx = gg.Context()
        a, d = ctx.tensor(gg.f32, (256,), "a"), ctx.tensor(gg.iq2_xxs, (256,), "d")
        ctx.alloc(rb)
        y = gg.cpy(a, d)
        with gg.Scheduler([rb, cb]) as sched:
            sched.set_backend(y, rb)
            with pytest.raises(gg.UnsupportedError, match=re.escape(
                    f"scheduler: no backend of {[rb.name, cb.name]} supports op CPY")):
                sched.alloc(gg.Graph(y))
        ctx.close()
