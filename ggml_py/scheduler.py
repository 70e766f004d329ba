"""The multi-device scheduler (owned): ``ggml_backend_sched``, one graph split across backends.

    >>> sched = gg.Scheduler([rpc_backend, cpu_backend])   # doctest: +SKIP
    >>> sched.compute(gg.Graph(out)); sched.n_splits, sched.n_copies

ggml's rules, checked here first: at most GGML_SCHED_MAX_BACKENDS backends, the last one on a
CPU device, every backend distinct. Node memory placed by the scheduler is valid until the
scheduler computes another graph or closes; after close() those tensors report no memory
instead of pointing at freed buffers.
"""
from __future__ import annotations

from ._handle import Owned
from ._loader import ffi, lib
from .backend import Backend
from .errors import GGMLError, InvalidArgument, check, require
from .graph import Graph, _walk, check_indices, require_open

MAX_BACKENDS = 16  # GGML_SCHED_MAX_BACKENDS (a private define of ggml-backend.cpp)
MAX_SRC = int(lib.GGML_MAX_SRC)


class Scheduler(Owned):
    """Schedules graphs over `backends` (highest priority first; the last must be a CPU)."""

    _kind = "scheduler"

    def __init__(self, backends, *, graph_size: int = 4096, parallel: bool = False,
                 op_offload: bool = True):
        backends = list(backends)
        require(backends and all(isinstance(b, Backend) for b in backends),
                "Scheduler needs a list of Backend objects")
        require(len(backends) <= MAX_BACKENDS, f"at most {MAX_BACKENDS} backends")
        require(len({id(b) for b in backends}) == len(backends), "a backend is listed twice")
        require(backends[-1].device.type == "cpu",
                f"the last backend must be on a CPU device (ggml's rule), not {backends[-1].name}")
        arr = ffi.new("ggml_backend_t[]", [b.ptr for b in backends])
        raw = lib.ggml_backend_sched_new(arr, ffi.NULL, len(backends), int(graph_size),
                                         bool(parallel), bool(op_offload))
        if raw == ffi.NULL:
            raise GGMLError("ggml_backend_sched_new failed")
        guards = [b._guard for b in backends if b._guard is not None]
        self._guard = (lambda: all(g() for g in guards)) if guards else None
        super().__init__(raw, lib.ggml_backend_sched_free, parents=backends, guard=self._guard)
        self.backends = backends
        self._graph_size = int(graph_size)
        # (graph, raw nodes whose memory the scheduler placed, every node's own sources)
        self._placed = []
        self._pins = []     # (tensor, backend) from set_backend, applied at every allocation

    def _check(self, graph: Graph) -> None:
        require(isinstance(graph, Graph), "expected a gg.Graph")
        require_open(graph)
        self._alive()
        require(graph.n_nodes <= self._graph_size,
                f"the graph has {graph.n_nodes} nodes; this scheduler was made for "
                f"{self._graph_size} (Scheduler(graph_size=...))")
        for t, is_node in _walk(graph):
            if not is_node and t.data == ffi.NULL:
                raise InvalidArgument("a graph input has no memory: allocate and set it first")

    def reserve(self, graph: Graph) -> None:
        """Size the compute buffers for graphs like `graph` (optional; compute does it)."""
        self._check(graph)
        if not lib.ggml_backend_sched_reserve(self.ptr, graph.ptr):
            raise GGMLError("ggml_backend_sched_reserve failed (out of memory?)")

    def set_backend(self, tensor, backend: Backend) -> None:
        """Pin the node `tensor` to `backend` (one of the scheduler's) for the graphs computed
        from now on, until :meth:`reset` (ggml forgets pins at each of its resets; they are
        applied again before every allocation)."""
        require(any(b is backend for b in self.backends), "backend is not one of the scheduler's")
        lib.ggml_backend_sched_set_tensor_backend(self.ptr, tensor.ptr, backend.ptr)
        self._pins.append((tensor, backend))
        self._forget()                 # the next compute splits the graph again

    def backend_of(self, tensor) -> Backend | None:
        p = lib.ggml_backend_sched_get_tensor_backend(self.ptr, tensor.ptr)
        return next((b for b in self.backends if b.ptr == p), None)

    def alloc(self, graph: Graph) -> None:
        """Split `graph` and allocate its nodes across the backends."""
        self._check(graph)
        self._forget()
        lib.ggml_backend_sched_reset(self.ptr)
        for t, b in self._pins:
            lib.ggml_backend_sched_set_tensor_backend(self.ptr, t.ptr, b.ptr)
        nodes = [t for t, is_node in _walk(graph) if is_node]
        placed = [t for t in nodes if t.data == ffi.NULL]
        # ggml's scheduler points the sources of split nodes at copies in its own context,
        # which it frees at the next split: keep the real sources to put back (_forget)
        sources = [(t, [t.src[j] for j in range(MAX_SRC)]) for t in nodes]
        self._placed.append((graph, placed, sources))
        for c in graph._contexts:      # a context closing first hands its graphs back (_forget)
            if not any(k is self for k in c._keep):
                c._keep.append(self)
        if not lib.ggml_backend_sched_alloc_graph(self.ptr, graph.ptr):
            self._forget()
            raise GGMLError("the scheduler could not allocate the graph (out of memory?)")

    def compute(self, graph: Graph) -> None:
        self._compute(graph, lib.ggml_backend_sched_graph_compute)

    def compute_async(self, graph: Graph) -> None:
        """Queue the graph; call synchronize() before reading results."""
        self._compute(graph, lib.ggml_backend_sched_graph_compute_async)

    def _compute(self, graph, fn) -> None:
        self._alive()
        require_open(graph)            # before reading its index inputs
        check_indices(graph)
        if not any(entry[0] is graph for entry in self._placed):
            self.alloc(graph)
        check(fn(self.ptr, graph.ptr), "scheduled graph compute")

    def synchronize(self) -> None:
        self._alive()
        lib.ggml_backend_sched_synchronize(self.ptr)

    def _alive(self) -> None:
        self.ptr
        for b in self.backends:
            b._alive()

    def reset(self) -> None:
        """Drop the current allocation (the tensors it placed lose their memory) and the
        pins made with :meth:`set_backend`."""
        lib.ggml_backend_sched_reset(self.ptr)
        self._forget()
        self._pins.clear()

    @property
    def n_splits(self) -> int:
        return int(lib.ggml_backend_sched_get_n_splits(self.ptr))

    @property
    def n_copies(self) -> int:
        return int(lib.ggml_backend_sched_get_n_copies(self.ptr))

    def buffer_size(self, backend: Backend) -> int:
        return int(lib.ggml_backend_sched_get_buffer_size(self.ptr, backend.ptr))

    def _forget(self) -> None:
        """Give graphs back as they were: their own sources again (not the scheduler's copies),
        and the nodes it placed read as unallocated."""
        for graph, nodes, sources in self._placed:
            graph._checked.clear()           # its nodes must be placed again before a compute
            if any(c.closed for c in graph._contexts):
                continue                     # (its tensors' memory is gone)
            for t, srcs in sources:
                for j, s in enumerate(srcs):
                    t.src[j] = s
            for t in nodes:
                t.data = ffi.NULL
                t.buffer = ffi.NULL
        self._placed = []

    def close(self) -> None:
        if self._raw is not None:
            if self._guard is None or self._guard():   # a dead RPC server would abort
                lib.ggml_backend_sched_synchronize(self._raw)
            self._forget()
        super().close()

    def __repr__(self):
        return "<Scheduler closed>" if self.closed else \
            f"<Scheduler {[b.name for b in self.backends]}>"
