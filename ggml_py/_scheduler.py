"""The multi-device scheduler (owned): ``ggml_backend_sched``, one graph split across backends.

    >>> sched = gg.Scheduler([rpc_backend, cpu_backend])   # doctest: +SKIP
    >>> sched.compute(gg.Graph(out)); sched.n_splits, sched.n_tensor_copies

ggml's rules, checked here first: at most GGML_SCHED_MAX_BACKENDS backends, the last one on a
CPU device, every backend distinct, every op supported by some backend. Node memory placed by
the scheduler is valid until the scheduler computes another graph or closes; after close()
those tensors report no memory instead of pointing at freed buffers, while numpy views and
DLPack exports made before keep the memory they read until they are collected.

Inputs without memory, marked with ``t.set_input()``, are placed by the scheduler the way
llama.cpp feeds its inputs: ``sched.alloc(graph)``, then ``x.set(values)``, then
``sched.compute(graph)``.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable

import numpy as np

from ._backend import Backend
from ._graph import Graph
from . import _handle, _rewire, _written
from ._handle import Owned, Placer
from ._rpc_liveness import endpoint_of, free_guard, supports_op
from ._loader import cstr, ffi, lib
from .errors import GGMLError, InvalidArgument, InvalidType, UnsupportedError, OutOfMemory, check_status, require

MAX_BACKENDS = 16  # GGML_SCHED_MAX_BACKENDS (a private define of ggml-backend.cpp)
_INPUT = int(lib.GGML_TENSOR_FLAG_INPUT)
_OP_NONE = int(lib.GGML_OP_NONE)


def _addr(p: Any) -> int:
    return int(ffi.cast("uintptr_t", p))


class Scheduler(Owned, Placer):
    """Schedules graphs over `backends` (highest priority first; the last must be a CPU)."""

    _kind = "scheduler"

    def __init__(self, backends: list[Backend], *, graph_size: int = 4096, parallel: bool = False,
                 op_offload: bool = True) -> None:
        require(isinstance(backends, (list, tuple)), "Scheduler: needs a list of Backend objects",
                InvalidType)
        backends = list(backends)
        require(bool(backends) and all(isinstance(b, Backend) for b in backends),
                "Scheduler: needs a list of Backend objects", InvalidType)
        require(isinstance(graph_size, int) and not isinstance(graph_size, bool)
                and 1 <= graph_size <= (1 << 24),
                f"Scheduler: graph_size must be an int in 1..{1 << 24}, got {graph_size!r}")
        for b in backends:
            b.ensure_alive()
        require(len(backends) <= MAX_BACKENDS, f"at most {MAX_BACKENDS} backends")
        require(len({id(b) for b in backends}) == len(backends), "a backend is listed twice")
        # a meta device's graphs are checked before each compute (gg.meta_device); the
        # scheduler would hand ggml split graphs unchecked, and ggml aborts on what it lacks
        require(all(b.device.type != "meta" for b in backends),
                "Scheduler: a meta device's backend computes graphs itself (be.compute); "
                "scheduling across it is not checked by ggml_py", UnsupportedError)
        require(backends[-1].device.type == "cpu",
                f"the last backend must be on a CPU device (ggml's rule), not {backends[-1].name}")
        arr = ffi.new("ggml_backend_t[]", [b.ptr for b in backends])
        raw = lib.ggml_backend_sched_new(arr, ffi.NULL, len(backends), int(graph_size),
                                         bool(parallel), bool(op_offload))
        if raw == ffi.NULL:
            raise GGMLError("ggml_backend_sched_new failed")
        guards = [g for g in (free_guard(b.device.ptr) for b in backends) if g is not None]
        self._guard = (lambda: all(g() for g in guards)) if guards else None
        super().__init__(raw, lib.ggml_backend_sched_free, parents=backends, guard=self._guard)
        self.backends = backends
        self._graph_size = int(graph_size)
        # (graph, raw tensors whose memory the scheduler placed)
        self._placed: list[tuple[Graph, list[Any]]] = []
        # from set_backend (tensor address -> (tensor, backend)), applied at each alloc to the
        # graph's own tensors
        self._pins: dict[int, tuple[weakref.ref[Any], Any, Backend]] = {}
        self._splits = _rewire.Splits()    # the split nodes it points at its copies
        self._checked_at = _handle.MEMORY_CHANGES   # changes seen when the placement was checked
        self._node_data: Any = np.zeros(0, np.uint64)
        # the graph ggml's allocator last measured (see _alloc); None: none yet
        self._measured: weakref.ref[Graph] | None = None
        self._n_tensor_copies = 0      # tensors copied between backends (see n_tensor_copies)
        self.on_close(self._finish)

    @property
    def graph(self) -> Graph | None:
        """The graph placed last (None before the first)."""
        return self._placed[-1][0] if self._placed else None

    def _check(self, graph: Graph, *, inputs_set: bool) -> None:
        require(isinstance(graph, Graph), f"expected a gg.Graph, not {type(graph).__name__}",
                InvalidType)
        graph._require_open()
        self.ensure_alive()
        require(graph.n_nodes <= self._graph_size,
                f"the graph has {graph.n_nodes} nodes; this scheduler was made for "
                f"{self._graph_size} (Scheduler(graph_size=...))")
        for t, is_node in graph.walk():
            if not is_node and t.data == ffi.NULL:
                name = ffi.string(t.name).decode(errors="replace") or "(unnamed)"
                if not int(t.flags) & _INPUT:
                    raise InvalidArgument(
                        f"scheduler: graph input {name!r} has no memory: allocate and set it, or "
                        "mark it t.set_input() so the scheduler places it (then sched.alloc(graph), "
                        "set it, sched.compute(graph))")
                if inputs_set:
                    raise InvalidArgument(
                        f"scheduler: input {name!r} has no memory yet: call sched.alloc(graph) "
                        "first, then set it, then compute")
            if is_node and int(t.op) != _OP_NONE and not any(
                    supports_op(lib.ggml_backend_get_device(b.ptr), t) for b in self.backends):
                raise UnsupportedError(
                    f"scheduler: no backend of {[b.name for b in self.backends]} supports op "
                    f"{ffi.string(lib.ggml_op_desc(t)).decode()}")
            self._check_memory_usable(t)

    def _check_memory_usable(self, t: Any) -> None:
        """A tensor with memory (its own or its view source's) must be usable where it is by
        one of the scheduler's backends that runs its op: ggml cannot move placed memory and
        aborts the process on one no backend can use ("pre-allocated tensor ... in a buffer
        that cannot run the operation"), leaf, node or view alike."""
        buf = t.view_src.buffer if t.view_src != ffi.NULL else t.buffer
        if buf == ffi.NULL:
            return
        buft = lib.ggml_backend_buffer_get_type(buf)
        if any(lib.ggml_backend_supports_buft(b.ptr, buft) and
               lib.ggml_backend_supports_op(b.ptr, t) for b in self.backends):
            return
        raise InvalidArgument(
            f"scheduler: {cstr(t.name) or '(unnamed)'!r} ({cstr(lib.ggml_op_desc(t))}) has "
            f"memory in a {cstr(lib.ggml_backend_buft_name(buft))} buffer, which no backend of "
            f"{[b.name for b in self.backends]} can use for it (ggml cannot move placed "
            "memory): add a backend of that device to the scheduler, or copy the tensor to "
            "memory one of them can use")

    def reserve(self, graph: Graph) -> None:
        """Size the compute buffers for graphs like `graph` (optional; compute does it)."""
        self._check(graph, inputs_set=False)
        _rewire.give_back(graph.contexts)       # this scheduler's and others'
        self._measure(graph, _rewire.sources_of(t for t, is_node in graph.walk() if is_node))

    def _measure(self, graph: Graph, sources: _rewire.Sources) -> None:
        """ggml_backend_sched_reserve for `graph`; the nodes its split points at the
        scheduler's copies get their `sources` back (the copies are of no use after it)."""
        ok = lib.ggml_backend_sched_reserve(self.ptr, graph.ptr)
        _rewire.restore(sources)
        if not ok:
            raise GGMLError("ggml_backend_sched_reserve failed (out of memory?)")
        self._measured = weakref.ref(graph)

    def _member(self, backend: Any, what: str) -> Backend:
        """`backend`, one of this scheduler's (ggml aborts on any other): the one rule for
        every method that takes a backend."""
        require(isinstance(backend, Backend), f"{what}: expected a Backend, not "
                                              f"{type(backend).__name__}", InvalidType)
        require(any(b is backend for b in self.backends),
                f"{what}: backend {backend.name if not backend.closed else '(closed)'} is not "
                f"one of the scheduler's {[b.name for b in self.backends]}")
        member: Backend = backend
        return member

    def set_backend(self, tensor: Any, backend: Backend) -> None:
        """Pin the node `tensor` to `backend` (one of the scheduler's) for the graphs computed
        from now on, until :meth:`reset`. Pins are kept here, one per tensor, and given to
        ggml at each allocation for the tensors of the graph being placed only (ggml keeps
        them in a hash set sized for one graph, and aborts when it overflows)."""
        self._member(backend, "set_backend")
        tensor.ptr                     # (ClosedError once its context closed)
        # (the context weakly: a pin does not keep an old graph's tensors alive; a pin whose
        # context died or closed is dropped, its address may be reused)
        self._pins[_addr(tensor.ptr)] = (weakref.ref(tensor.ctx), tensor.ptr, backend)
        self._forget()                 # the next compute splits the graph again

    def backend_of(self, tensor: Any) -> Backend | None:
        """The Backend the scheduler placed (or was told to place) `tensor` on; None when not
        placed."""
        p = lib.ggml_backend_sched_get_tensor_backend(self.ptr, tensor.ptr)
        found = next((b for b in self.backends if b.ptr == p), None)
        if found is None:
            pin = self._pins.get(_addr(tensor.ptr))
            if pin is not None and pin[0]() is tensor.ctx:
                return pin[2]
        return found

    def alloc(self, graph: Graph) -> None:
        """Split `graph` and allocate its nodes (and its unallocated inputs marked with
        ``t.set_input()``) across the backends."""
        with self._locked():
            self._alloc(graph, inputs_set=False)

    def _alloc(self, graph: Graph, *, inputs_set: bool) -> None:
        self._check(graph, inputs_set=inputs_set)
        self._forget()
        _rewire.give_back(graph.contexts)       # other schedulers' copies
        # nodes another graph's allocator or scheduler placed, for its own graph (where they
        # may share memory with its other nodes), are placed again here
        addrs, _, _, other = graph.node_memory()
        graph._let_go(addrs, other)
        lib.ggml_backend_sched_reset(self.ptr)
        self._apply_pins(graph)
        entries = list(graph.walk())
        nodes = [t for t, is_node in entries if is_node]
        placed = [t for t, _ in entries if t.data == ffi.NULL]
        sources = _rewire.sources_of(nodes)     # (before the split rewires some)
        if self._measured is not None and self._measured() is not graph:   # (or it is gone)
            # ggml's allocator keeps the offsets it chose for the last graph and reuses them
            # for any graph with as many nodes and leafs whose tensors fit, without comparing
            # how they connect: a node could land on memory a source of it still holds, and
            # read wrong values. A different graph is measured first, then the pins applied
            # again (measuring resets them).
            self._measure(graph, sources)
            self._apply_pins(graph)
        self._measured = weakref.ref(graph)
        self._placed.append((graph, placed))
        self._splits.placing(graph.contexts, sources)
        graph.scheduler = self
        for c in graph.contexts:       # a context closing first hands its graphs back (_forget)
            c.keep(self)
        if not lib.ggml_backend_sched_alloc_graph(self.ptr, graph.ptr):
            self._forget()
            raise OutOfMemory("the scheduler could not allocate the graph (out of memory?)")
        self._n_tensor_copies = self._splits.split(graph.contexts, sources)
        self._node_data = graph.placement()      # where it placed each node
        self._checked_at = _handle.MEMORY_CHANGES
        self._check_placed_backends(nodes)

    def _check_placed_backends(self, nodes: list[Any]) -> None:
        """Refuse a node ggml placed on a backend that cannot run its op or use its memory."""
        # a node that had memory before (another graph's allocation placed it) stays where it
        # is, and ggml runs it on the backend it was pinned to or chose, in place: that
        # backend must be able to use the memory (ggml does not check, and computes garbage)
        rpc = {_addr(b.ptr) for b in self.backends if endpoint_of(b.device.ptr)}
        for t in nodes:
            be = lib.ggml_backend_sched_get_tensor_backend(self.ptr, t)
            if rpc and be != ffi.NULL and _addr(be) in rpc and int(t.op) != _OP_NONE and \
                    not supports_op(lib.ggml_backend_get_device(be), t):
                # ggml placed it by its own answer; an RPC server would die of it
                self._forget()
                raise UnsupportedError(
                    f"scheduler: ggml placed op {cstr(lib.ggml_op_desc(t))} of node "
                    f"{cstr(t.name) or '(unnamed)'!r} on {cstr(lib.ggml_backend_name(be))}, which "
                    "cannot run it (its server's backend lacks it); pin the node to another "
                    "backend with set_backend")
            if t.buffer == ffi.NULL:
                continue
            buft = lib.ggml_backend_buffer_get_type(t.buffer)
            if be != ffi.NULL and not lib.ggml_backend_supports_buft(be, buft):
                self._forget()
                name = cstr(t.name) or cstr(lib.ggml_op_desc(t))
                raise InvalidArgument(
                    f"scheduler: node {name!r} already has memory in a "
                    f"{cstr(lib.ggml_backend_buft_name(buft))} buffer (placed by another "
                    f"graph's allocation), which backend {cstr(lib.ggml_backend_name(be))}, "
                    "where the scheduler runs it, cannot use; build the graph from fresh "
                    "nodes, or pin the node to a backend that can")

    def compute(self, graph: Graph) -> None:
        """Split, place and compute `graph`, and wait for it."""
        self._compute(graph, lib.ggml_backend_sched_graph_compute)

    def compute_async(self, graph: Graph) -> None:
        """Queue the graph; call synchronize() before reading results."""
        self._compute(graph, lib.ggml_backend_sched_graph_compute_async)

    @contextlib.contextmanager
    def _locked(self) -> Any:
        """The scheduler's lock and its backends' (other threads may drive them too)."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._lock)
            for b in self.backends:
                stack.enter_context(b.lock)
            yield

    def _compute(self, graph: Graph, fn: Callable[..., Any]) -> None:
        require(isinstance(graph, Graph), f"expected a gg.Graph, not {type(graph).__name__}",
                InvalidType)
        with self._locked(), contextlib.ExitStack() as stack:
            for c in sorted(graph.contexts, key=id):
                stack.enter_context(c.lock)
            self.ensure_alive()
            graph._require_open()           # before reading its index inputs
            if not self._splits.active or not any(entry[0] is graph for entry in self._placed):
                self._alloc(graph, inputs_set=True)
            elif self._checked_at != _handle.MEMORY_CHANGES:
                self._recheck(graph)
            graph.check_indices()
            check_status(fn(self.ptr, graph.ptr), "scheduled graph compute")
            _written.ran(graph, graph.contexts)   # its nodes hold values (see _written)

    def _recheck(self, graph: Graph) -> None:
        """Something closed or was handed back since the graph was placed. A leaf without
        memory (a buffer closed under it) is refused; nodes without memory, or moved (another
        graph's allocator placed them again for itself), are placed again here, unless inputs
        placed here hold values the user set (placing again would lose them)."""
        mine = {_addr(t) for g, placed in self._placed if g is graph for t in placed}
        for t, is_node in graph.walk():
            if not is_node and t.data == ffi.NULL and _addr(t) not in mine:
                raise InvalidArgument(
                    f"scheduler: tensor {cstr(t.name) or '(unnamed)'!r} has no memory (its "
                    "buffer was closed); allocate it again and set it")
        _, _, datas, other = graph.node_memory()
        rec = self._node_data if len(self._node_data) == len(datas) else 0
        if ((datas == 0) | (other & (datas != rec))).any():
            if any(not is_node and _addr(t) in mine for t, is_node in graph.walk()):
                raise InvalidArgument(
                    "scheduler: nodes of this graph have no memory here any more (another "
                    "scheduler or graph placed them again); call sched.alloc(graph), set its "
                    "inputs again, then compute")
            self._alloc(graph, inputs_set=True)
        self._checked_at = _handle.MEMORY_CHANGES

    def synchronize(self) -> None:
        """Wait until every backend of the scheduler finished its queued work."""
        with self._locked():
            self.ensure_alive()
            lib.ggml_backend_sched_synchronize(self.ptr)

    def ensure_alive(self) -> None:
        """ClosedError once closed; RPCError when a backend's RPC server is gone."""
        self.ptr
        for b in self.backends:
            b.ensure_alive()

    def _apply_pins(self, graph: Graph) -> None:
        if not self._pins:
            return
        for a, (ctx, p, b) in list(self._pins.items()):
            c = ctx()
            if c is None or c.closed:
                del self._pins[a]      # (its tensor is gone: the address may be reused)
        mine = {_addr(p) for p, _ in graph.walk()}
        for a, (_, p, b) in self._pins.items():
            if a in mine:
                lib.ggml_backend_sched_set_tensor_backend(self.ptr, p, b.ptr)

    def reset(self) -> None:
        """Drop the current allocation (the tensors it placed lose their memory) and the
        pins made with :meth:`set_backend`."""
        lib.ggml_backend_sched_reset(self.ptr)
        self._forget()
        self._pins.clear()

    @property
    def n_splits(self) -> int:
        """How many pieces ggml cut the placed graph into, one per change of backend."""
        return int(lib.ggml_backend_sched_get_n_splits(self.ptr))

    @property
    def n_graph_copies(self) -> int:
        """ggml's number of pipeline copies of the graph's inputs (``sched_get_n_copies``):
        1, or more with ``parallel=True``. Not the tensors copied between backends: that is
        :attr:`n_tensor_copies`."""
        return int(lib.ggml_backend_sched_get_n_copies(self.ptr))

    @property
    def n_copies(self) -> int:
        """Deprecated name of :attr:`n_graph_copies` (it never counted copied tensors)."""
        return self.n_graph_copies

    @property
    def n_tensor_copies(self) -> int:
        """How many tensors the scheduler copies from one backend to another at each compute
        of the placed graph (the inputs of its splits); 0 before a graph is placed."""
        return self._n_tensor_copies

    def buffer_size(self, backend: Backend) -> int:
        """Bytes of the compute buffer the scheduler holds on `backend`."""
        self._member(backend, "buffer_size")
        return int(lib.ggml_backend_sched_get_buffer_size(self.ptr, backend.ptr))

    def context_closing(self) -> None:
        """A context it placed tensors for closes (Placer): give its graphs back first."""
        if not self.closed:
            self._forget()

    def _forget(self) -> None:
        """Give graphs back as they were: their own sources again (not the scheduler's copies),
        and the nodes it placed read as unallocated."""
        self._splits.give_back()            # their own sources again
        self._splits.clear()
        if self._placed:
            _handle.changed()                # other graphs may share the nodes it placed
        for graph, nodes in self._placed:
            graph._forget_allocation()        # its nodes must be placed again before a compute
            if any(c.closed for c in graph.contexts):
                continue                     # (its tensors' memory is gone)
            for t in nodes:
                t.data = ffi.NULL
                t.buffer = ffi.NULL
            gone = {_addr(t) for t in nodes}
            for c in graph.contexts:         # views of them made meanwhile, too
                c.lose_placed(gone)
        self._placed = []

    def _finish(self) -> None:
        """The first step of close(): its work done, the tensors it placed read as
        unallocated."""
        if self._guard is None or self._guard():   # a dead RPC server would abort
            lib.ggml_backend_sched_synchronize(self._raw)
        self._forget()

    def _repr_html_(self) -> str:
        try:
            from ._display import scheduler_html
        except ImportError:
            return f"<pre>{self!r}</pre>"
        return str(scheduler_html(self))

    def __repr__(self) -> str:
        return "<Scheduler closed>" if self.closed else \
            f"<Scheduler {[b.name for b in self.backends]}>"
