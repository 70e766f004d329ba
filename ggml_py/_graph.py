"""Compute graphs: ``ggml_new_graph_custom``, ``ggml_build_forward_expand``, compute on a backend.

    >>> g = gg.Graph(out)                          # doctest: +SKIP
    >>> be.compute(g); out.numpy()

Before a graph reaches ggml it is checked (``_graph_check``): every leaf must hold data, every
tensor that holds data must sit in a buffer the backend can use, and the backend must support
every op. A graph cannot change once built, so this runs once per backend; later computes only
check that nothing closed and range-check index inputs. Nodes without memory are placed by ggml's
graph allocator (``ggml_gallocr``); that memory stays valid as long as the graph's context
lives.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
import weakref
from typing import TYPE_CHECKING, Any, Iterator, cast

import numpy as np

from . import _graph_check, _graph_nodes, _handle, _record_pool, _rewire, _written
from ._handle import Owned, Placer
from ._interfaces import Computable
from ._rpc_liveness import free_guard, second_opinion
from ._loader import HELPERS, ffi, lib
from ._tensor import Tensor
from .errors import ClosedError, InvalidType, OutOfMemory, check_ptr, check_status, require

if TYPE_CHECKING:
    from ._backend import Backend
    from ._context import Context

_PREPARE: Any = lib.ggml_py_prepare if HELPERS else None    # the C helper (API-mode builds)
_MAX_NODES = 1 << 24
_MAX_SRC = int(lib.GGML_MAX_SRC)
_WORDS = ffi.typeof("uintptr_t *")
_TENSOR = ffi.typeof("struct ggml_tensor *")


class _GraphMemory(Owned):
    """A graph's ggml memory. Closed with the graph or a context of its tensors; given back
    (to _record_pool) only when this object is collected with its Graph, so that a stale
    read of a closed graph reads that graph, never a newer one built in the reused chunk."""

    _kind = "graph"
    _frees_at_close = False


# ops that only describe a layout over their source's memory: computing them writes nothing
_LAYOUT_OPS = frozenset(int(getattr(lib, f"GGML_OP_{n}")) for n in
                        ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"))


_addr = _graph_nodes.addr


def _entries(nodes: list[Any], leafs: list[Any]) -> Iterator[tuple[Any, bool]]:
    return itertools.chain(zip(nodes, itertools.repeat(True)), zip(leafs, itertools.repeat(False)))


class Graph(Placer, Computable):
    """A forward graph over `outputs` (a tensor or a list of tensors)."""

    def __init__(self, outputs: Tensor | list[Tensor], *, capacity: int | None = None) -> None:
        outs = [outputs] if isinstance(outputs, Tensor) else list(outputs) \
            if isinstance(outputs, (list, tuple)) else None
        require(bool(outs) and all(isinstance(t, Tensor) for t in outs or ()),
                "Graph: needs a Tensor or a non-empty list of Tensors", InvalidType)
        assert outs is not None
        self.outputs = outs
        self.ctx: Context = cast("Context", outs[0].ctx)
        self._allocs: dict[int, Owned] = {}
        self._checked: weakref.WeakSet[Backend] = weakref.WeakSet()  # validated and allocated
        self._checked_at = _handle.MEMORY_CHANGES   # (changes since: see prepare)
        # the backend the last compute ran on, when nothing needs a check per compute there
        # (no RPC liveness, no index inputs): with nothing closed since, the next compute on
        # it goes straight to ggml
        self._fast: weakref.ref[Backend] | None = None
        self._fast_checked_at = -1
        self._placed_data: Any = np.zeros(0, np.uint64)   # per node: where its allocator put it
        self._index_inputs: list[_graph_check.IndexInput] | None = None
        self._nodes: list[Any] | None = None    # the walk (see walk())
        self._leafs: list[Any] = []
        self._written: set[int] | None = None
        self.scheduler: Any = None          # the scheduler that placed it last, if any
        contexts: dict[int, Context] = {}
        for t in outs:
            for c in t.ctx.contexts(include_closed=True):
                contexts[id(c)] = c
        with contextlib.ExitStack() as stack:
            # every context holding a tensor of the graph stays open while ggml walks it:
            # another thread closing one waits until the graph is built (locks sorted by id,
            # the order compute and the op builders take them in)
            for c in sorted(contexts.values(), key=id):
                stack.enter_context(c.lock)
            for t in outs:
                t.ptr                        # ClosedError for a tensor of a closed context
            closed = [c for c in contexts.values() if c.closed]
            if closed:
                _graph_nodes.refuse_closed_operands([t.ptr for t in outs], closed)
                contexts = {k: c for k, c in contexts.items() if not c.closed}
            self._build(outs, contexts, capacity)
            self.ctx.keep(self)  # node memory placed by the allocator lives with the context

    def _build(self, outs: list[Tensor], contexts: dict[int, "Context"],
               capacity: int | None) -> None:
        """The graph's memory and nodes; the caller holds the locks of `contexts`."""
        # nodes of these contexts that a scheduler points at its copies get their own sources
        # back before anything walks them
        _rewire.give_back(contexts.values())
        # every tensor of the graph lives in one of these contexts: their tensor count bounds
        # the graph (one C call per chunk instead of a walk of the graph in Python)
        count = sum(c.n_tensors() for c in contexts.values())
        if capacity is not None:
            require(isinstance(capacity, int) and not isinstance(capacity, bool),
                    "Graph: capacity must be an int", InvalidType)
            if capacity < count:
                count = _graph_nodes.count_nodes([t.ptr for t in outs])
            require(capacity >= count, f"Graph: capacity {capacity} cannot hold this graph's "
                                       f"{count} tensors (leave it out: the capacity follows "
                                       "the graph)")
            require(capacity <= _MAX_NODES, f"Graph: capacity must be at most {_MAX_NODES}")
        n = capacity or max(int(lib.GGML_DEFAULT_GRAPH_SIZE), 2 * count + 16)
        overhead = int(lib.ggml_graph_overhead_custom(n, False))
        raw = check_ptr(_record_pool.new(overhead + 1024),
                        "Graph: ggml_init failed for the graph")
        try:
            self._contexts = list(contexts.values())
            self.ptr = lib.ggml_new_graph_custom(raw, n, False)
            for t in outs:
                lib.ggml_set_output(t.ptr)
                lib.ggml_build_forward_expand(self.ptr, t.ptr)
            if len(self._contexts) > 1:
                self._contexts = self._reached(self._contexts)
        except BaseException:
            _record_pool.release(raw)
            raise
        # every context holding a node or leaf (and only those): a closed one would leave the
        # graph pointing into freed memory, so computing then raises instead
        self._meta = _GraphMemory(raw, _record_pool.release, parents=tuple(self._contexts))

    def _reached(self, contexts: list["Context"]) -> list["Context"]:
        """The contexts of `contexts` that hold a node or leaf of this graph (a context the
        outputs' contexts use for other tensors is none of the graph's business: closing it
        leaves this graph alone)."""
        entries = list(self.walk())                  # (kept: the first compute uses it)
        addrs = np.array([_addr(t) for t, _ in entries], np.uint64)
        out = []
        for c in contexts:
            if c is self.ctx or any(np.any((addrs >= lo) & (addrs < hi)) for lo, hi in c.spans()):
                out.append(c)
        return out

    # -- structure ---------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        """How many op nodes the graph has (leafs not counted)."""
        self._meta.ptr       # (ClosedError once closed, or a context of its tensors is)
        return int(lib.ggml_graph_n_nodes(self.ptr))

    @property
    def contexts(self) -> list["Context"]:
        """Every context holding a tensor of this graph."""
        return list(self._contexts)

    def _wrap(self, p: Any) -> Tensor:
        for c in self._contexts:
            if c.owns(p):
                return c.wrap(p)
        return self.ctx.wrap(p)

    @property
    def nodes(self) -> list[Tensor]:
        """The graph's op nodes as Tensors, in ggml's compute order."""
        self._require_open()
        return [self._wrap(lib.ggml_graph_node(self.ptr, i)) for i in range(self.n_nodes)]

    @property
    def leafs(self) -> list[Tensor]:
        """Inputs and constants: sources of nodes that are not nodes themselves."""
        self._require_open()
        return [self._wrap(t) for t, is_node in self.walk(fresh=True) if not is_node]

    def walk(self, fresh: bool = False) -> Iterator[tuple[Any, bool]]:
        """(raw tensor, is_node) for every node, then every leaf (a source that is no node).

        ``struct ggml_cgraph`` is opaque in the public headers, so leafs are found through the
        nodes' sources. A graph cannot change once built: the walk is made once and kept
        (cffi pointers hash and compare by address). `fresh` walks again: a scheduler points
        split nodes at copies of its own until its next split, and pictures show them."""
        if self._nodes is None or fresh:
            n = int(lib.ggml_graph_n_nodes(self.ptr))     # (walked while building, too)
            nodes: list[Any] = ffi.unpack(lib.ggml_graph_nodes(self.ptr), n) if n else []
            keys = set(ffi.unpack(ffi.cast(_WORDS, lib.ggml_graph_nodes(self.ptr)), n)) \
                if n else set()                   # the nodes' addresses
            if fresh or _rewire.rewired(self._contexts):
                srcs = [_addr(s) for t in nodes
                        for s in (t.src if fresh else _rewire.own_sources(t, self._contexts)) if s]
            else:           # every node's sources as addresses: no cffi object per source
                srcs = []
                for t in nodes:
                    srcs += ffi.unpack(ffi.cast(_WORDS, t.src), _MAX_SRC)
            # sources that are no node, in the order they are first met
            leafs = [ffi.cast(_TENSOR, s) for s in dict.fromkeys(srcs) if s and s not in keys]
            if fresh:
                return _entries(nodes, leafs)
            self._nodes, self._leafs = nodes, leafs
        return _entries(self._nodes, self._leafs)

    def written_addresses(self) -> set[int]:
        """The addresses (raw ``struct ggml_tensor *``) of the tensors a compute writes: its
        nodes that compute something, and the tensors those of them that are views write into
        (``cpy``'s destination, an in-place op's or ``set_rows``' target). A reshape, view,
        permute or transpose node computes nothing: it reads as written when the tensor it
        views does (see _written), not because its graph ran."""
        self.walk()
        if self._written is None:
            written: set[int] = set()
            for t in self._nodes or ():
                if int(t.op) in _LAYOUT_OPS:
                    continue
                written.add(_addr(t))
                if t.view_src:
                    written.add(_addr(t.view_src))
            self._written = written
        return self._written

    def _require_open(self) -> None:
        """ClosedError when a context holding tensors of this graph was closed."""
        for c in self._contexts:
            if c.closed:
                raise ClosedError("a context holding tensors of this graph was closed")
        self._meta.ptr

    def placed_memory(self) -> Iterator[Owned]:
        """The node memory its allocator placed (Placer)."""
        return iter(list(self._allocs.values()))

    def _forget_allocation(self) -> None:
        """Its nodes must be validated and placed again before the next compute (a scheduler
        took their memory back)."""
        self._checked = weakref.WeakSet()
        self._fast = None

    # -- checks ------------------------------------------------------------------------------
    def prepare(self, backend: "Backend", *, place: bool = True) -> None:
        """Validate for `backend` and allocate nodes that have no memory yet (once per
        backend: later computes of the same graph cost no Python work per node); with
        ``place=False`` validate only (``opt.gradients``: its own allocator places the nodes).

        One pass over the nodes, then one over the leafs: views made after their source was
        allocated get the source's buffer (ggml sets their address but not their buffer; the
        allocator skips tensors with an address), every tensor that holds memory must sit in
        a buffer the backend can use, the backend must support every node's op, and every
        leaf must hold memory."""
        self._require_open()
        be = backend.ptr
        if self._checked_at != _handle.MEMORY_CHANGES:
            # something closed since the last check (a buffer under a leaf, a backend...):
            # validated is no longer known
            self._checked = weakref.WeakSet()
            self._checked_at = _handle.MEMORY_CHANGES
        if backend in self._checked:
            return
        addrs, bufs, datas, other = self.node_memory()
        # nodes whose memory is neither a buffer of the graph's contexts nor where this
        # graph's allocator put them: another graph's allocator or a scheduler placed them
        # for its own graph, where they may share memory with its other nodes; they are
        # placed again here, with this graph's (before the checks: they judge the new place)
        mine = self._placed_data if len(self._placed_data) == len(datas) else 0
        released = bool((other & (datas != mine)).any())
        if released and place:
            self._let_go(addrs, other)
        dev = lib.ggml_backend_get_device(be)
        cpu = second_opinion(dev)             # (RPC devices: the CPU must support it too)
        if _PREPARE is not None and not _rewire.rewired(self._contexts):
            need_alloc = _graph_check.in_c(_PREPARE, self.ptr, self.n_nodes, backend, dev, cpu)
            self._indices()      # (every index node, not only those helpers.c found)
        else:
            self.walk()
            assert self._nodes is not None
            need_alloc, index_nodes = _graph_check.in_python(self._nodes, self._leafs,
                                                             backend, dev, cpu)
            if self._index_inputs is None:
                self._index_inputs = _graph_check.index_inputs(index_nodes)
        if not place:
            return
        if need_alloc:
            self._allocate_nodes(backend, released, addrs, other)
        self._checked.add(backend)

    def _allocate_nodes(self, backend: "Backend", released: bool, addrs: Any, other: Any) -> None:
        """Place the nodes that have no memory with this graph's allocator for `backend`."""
        buft = lib.ggml_backend_get_default_buffer_type(backend.ptr)
        key = _addr(buft)
        alloc = self._allocs.get(key)
        if not released:
            # the allocator places every node without memory of a context, all at once:
            # the ones it placed before too (placing only the new ones would let it
            # reuse, or free in a reallocation, memory the older ones point into)
            self._let_go(addrs, other)
        if alloc is None:
            raw = check_ptr(lib.ggml_gallocr_new(buft), "ggml_gallocr_new failed", OutOfMemory)
            alloc = self._allocs[key] = Owned(
                raw, lib.ggml_gallocr_free, parents=(self.ctx,),
                guard=free_guard(lib.ggml_backend_buft_get_device(buft)))
        if not lib.ggml_gallocr_alloc_graph(alloc.ptr, self.ptr):
            raise OutOfMemory(f"compute: allocating the graph's nodes on {backend.name} "
                              "failed (out of memory?)")
        self._placed_data = self.placement()

    def placement(self) -> Any:
        """Per node, the address an allocator or scheduler gave it (0 where its memory is a
        buffer of the graph's contexts, or none): the record to tell later whether another
        one placed it again."""
        _, _, datas, other = self.node_memory()
        return np.where(other, datas, 0)

    def node_memory(self) -> tuple[Any, Any, Any, Any]:
        """(addresses, buffers, data addresses, `other`) of the nodes, as numpy arrays read
        straight from the tensor records (no Python work per node); `other`: the nodes whose
        memory is not a buffer of the graph's contexts (an allocator or scheduler placed it)."""
        return _graph_nodes.node_memory(self.ptr, self.n_nodes, self._contexts)

    def _let_go(self, addrs: Any, mask: Any) -> None:
        """The nodes at `addrs[mask]` (and views of them) read as unallocated; every graph
        and scheduler checks again before its next compute."""
        if not mask.any():
            return
        gone = {int(a) for a in addrs[mask]}
        for a in gone:
            t = ffi.cast(_TENSOR, a)
            t.data = ffi.NULL
            t.buffer = ffi.NULL
        for c in self._contexts:
            c.lose_placed(gone)
        _handle.changed()
        self._checked = weakref.WeakSet()
        self._checked_at = _handle.MEMORY_CHANGES

    def _indices(self) -> list[_graph_check.IndexInput]:
        """(index tensor, rows it may address, op) for every get_rows/set_rows whose indices
        are a graph input: their values are checked at each compute (ggml asserts on a bad
        index, and an RPC server dies of it)."""
        if self._index_inputs is None:
            ops = (_graph_check.GET_ROWS, _graph_check.SET_ROWS)
            self._index_inputs = _graph_check.index_inputs(
                [t for t, is_node in self.walk() if is_node and t.op in ops])
        return self._index_inputs

    def check_indices(self) -> None:
        """InvalidArgument when an index input holds a row number out of range."""
        _graph_check.check_indices(self._indices())

    def compute_on(self, backend: "Backend", *, asynchronous: bool) -> None:
        """What ``backend.compute(graph)`` runs: checks, allocation, then ggml's compute."""
        if len(self._contexts) == 1:
            ctx = self._contexts[0]
            with backend.lock, ctx.lock:
                fast = self._fast
                if (fast is not None and self._fast_checked_at == _handle.MEMORY_CHANGES
                        and not asynchronous and fast() is backend and not ctx.rewired):
                    # validated for this backend and nothing closed or rewired since
                    status = lib.ggml_backend_graph_compute(backend._raw, self.ptr)
                    if status:                    # (a call less on the hot path)
                        check_status(status, "graph compute")
                    return
                self._compute_locked(backend, asynchronous)
            return
        with contextlib.ExitStack() as stack:
            # the backend's lock, then its contexts' (sorted): a context closed by another
            # thread waits until this compute is done instead of freeing memory under it
            stack.enter_context(backend.lock)
            for c in sorted(self._contexts, key=id):
                stack.enter_context(c.lock)
            self._compute_locked(backend, asynchronous)

    def _compute_locked(self, backend: "Backend", asynchronous: bool) -> None:
        backend.ensure_alive()
        _rewire.give_back(self._contexts)       # a scheduler's copies (rare)
        self.prepare(backend)
        self.check_indices()
        if asynchronous:
            backend.keep_until_synchronized(self)
            check_status(lib.ggml_backend_graph_compute_async(backend.ptr, self.ptr), "graph compute")
        else:
            check_status(lib.ggml_backend_graph_compute(backend.ptr, self.ptr), "graph compute")
        _written.ran(self, self._contexts)     # its nodes hold values (see _written)
        # the fast path's conditions: nothing here needs checking per compute
        self._fast = weakref.ref(backend) if backend._guard is None and not self._index_inputs \
            else None
        self._fast_checked_at = self._checked_at

    # -- pictures ----------------------------------------------------------------------------
    def to_dot(self, path: str | None = None) -> str:
        """Graphviz text of the graph (ggml_graph_dump_dot); written to `path` when given."""
        self._require_open()
        fd, tmp = tempfile.mkstemp(suffix=".dot")
        os.close(fd)
        try:
            lib.ggml_graph_dump_dot(self.ptr, ffi.NULL, tmp.encode())
            with open(tmp) as f:
                text = f.read()
        finally:
            os.unlink(tmp)
        if path:
            with open(path, "w") as f:
                f.write(text)
        return text

    def to_svg(self) -> str:
        """The graph as an SVG picture, drawn without Graphviz (Jupyter shows a Graph so)."""
        self._require_open()
        from . import _display
        return str(getattr(_display, "graph_svg")(self))

    def _repr_svg_(self) -> str:
        return self.to_svg()

    def _repr_html_(self) -> str:
        try:
            return self.to_svg()
        except ClosedError:
            return "<pre>&lt;Graph (a context closed)&gt;</pre>"

    def __repr__(self) -> str:
        try:
            self._require_open()
        except ClosedError:
            return "<Graph (a context closed)>"
        return f"<Graph nodes={self.n_nodes} outputs={len(self.outputs)}>"

    def __copy__(self) -> Any:
        raise TypeError("a Graph cannot be copied; build another from its outputs")

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError("a Graph cannot be copied; build another from its outputs")

    def __reduce__(self) -> Any:
        raise TypeError("a Graph cannot be pickled")


__all__ = ["Graph"]
