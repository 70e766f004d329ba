"""Compute graphs: ``ggml_new_graph_custom``, ``ggml_build_forward_expand``, compute on a backend.

    >>> g = gg.Graph(out)                          # doctest: +SKIP
    >>> be.compute(g); out.numpy()

Before a graph reaches ggml it is checked: every leaf must hold data, every tensor that holds
data must sit in a buffer the backend can use, and the backend must support every op. A
graph cannot change once built, so this runs once per backend; later computes only check
that nothing closed and range-check index inputs. Nodes without memory are placed by ggml's
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

from . import _handle, _record_pool, _written
from ._handle import Owned, Placer
from ._interfaces import Computable
from ._rpc_liveness import free_guard, second_opinion
from ._loader import HELPERS, cstr, ffi, lib
from ._tensor import Tensor
from ._tensor_base import give_back_rewired, own_sources
from .ops.index import index_origin
from .errors import ClosedError, GGMLError, InvalidArgument, InvalidType, UnsupportedError, OutOfMemory, check_ptr, check_status, require

if TYPE_CHECKING:
    from ._backend import Backend
    from ._context import Context

_GET_ROWS, _SET_ROWS = int(lib.GGML_OP_GET_ROWS), int(lib.GGML_OP_SET_ROWS)
_OP_NONE = int(lib.GGML_OP_NONE)
_PREPARE: Any = lib.ggml_py_prepare if HELPERS else None    # the C helper (API-mode builds)
_MAX_NODES = 1 << 24
_MAX_SRC = int(lib.GGML_MAX_SRC)
_WORDS = ffi.typeof("uintptr_t *")
_OFF_BUFFER = ffi.offsetof("struct ggml_tensor", "buffer") // 8   # (in 8-byte words)
_OFF_DATA = ffi.offsetof("struct ggml_tensor", "data") // 8
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


def _addr(p: Any) -> int:
    return int(ffi.cast("uintptr_t", p))


def _entries(nodes: list[Any], leafs: list[Any]) -> Iterator[tuple[Any, bool]]:
    return itertools.chain(zip(nodes, itertools.repeat(True)), zip(leafs, itertools.repeat(False)))


def _count_nodes(outs: list[Tensor]) -> int:
    """Tensors reachable from `outs` (an upper bound of nodes + leafs), on raw pointers."""
    seen: set[int] = set()
    stack = [t.ptr for t in outs]
    null = ffi.NULL
    while stack:
        p = stack.pop()
        k = _addr(p)
        if k in seen:
            continue
        seen.add(k)
        for s in p.src:            # (new graphs give split nodes their sources back first)
            if s != null:
                stack.append(s)
    return len(seen)


def _refuse_closed_operands(outs: list[Tensor], closed: list[Context]) -> None:
    """ClosedError when a tensor the graph reaches lives in a closed context (ggml would walk
    freed memory). Only run when a context the outputs' contexts use was closed: a walk that
    never reads a tensor of a closed context, so a graph that does not reach one is built."""
    seen: set[int] = set()
    stack = [t.ptr for t in outs]
    null = ffi.NULL
    while stack:
        p = stack.pop()
        k = _addr(p)
        if k in seen:
            continue
        seen.add(k)
        if any(c.owns(p) for c in closed):
            raise ClosedError("Graph: a tensor this graph reads lives in a closed context "
                              "(close a context only after the tensors built from it)")
        for s in (*p.src, p.view_src):
            if s != null:
                stack.append(s)


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
        self._epoch = _handle.EPOCH          # (closes since: see prepare)
        # the backend the last compute ran on, when nothing needs a check per compute there
        # (no RPC liveness, no index inputs): with nothing closed since, the next compute on
        # it goes straight to ggml
        self._fast: weakref.ref[Backend] | None = None
        self._fast_epoch = -1
        self._placed_data: Any = np.zeros(0, np.uint64)   # per node: where its allocator put it
        self._index_inputs: list[tuple[Any, int, str]] | None = None
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
                stack.enter_context(c._lock)
            for t in outs:
                t.ptr                        # ClosedError for a tensor of a closed context
            closed = [c for c in contexts.values() if c.closed]
            if closed:
                _refuse_closed_operands(outs, closed)
                contexts = {k: c for k, c in contexts.items() if not c.closed}
            self._build(outs, contexts, capacity)
            self.ctx.keep(self)  # node memory placed by the allocator lives with the context

    def _build(self, outs: list[Tensor], contexts: dict[int, "Context"],
               capacity: int | None) -> None:
        """The graph's memory and nodes; the caller holds the locks of `contexts`."""
        # a scheduler may point nodes of these contexts at its own copies: they get their
        # sources back before anything walks them (that scheduler splits again next time)
        give_back_rewired(contexts)
        # every tensor of the graph lives in one of these contexts: their tensor count bounds
        # the graph (one C call per chunk instead of a walk of the graph in Python)
        count = sum(c.n_tensors() for c in contexts.values())
        if capacity is not None:
            require(isinstance(capacity, int) and not isinstance(capacity, bool),
                    "Graph: capacity must be an int", InvalidType)
            if capacity < count:
                count = _count_nodes(outs)
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
            if fresh or any(c.rewired for c in self._contexts):
                srcs = [_addr(s) for t in nodes
                        for s in (t.src if fresh else own_sources(t, self._contexts)) if s]
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
        if self._epoch != _handle.EPOCH:
            # something closed since the last check (a buffer under a leaf, a backend...):
            # validated is no longer known
            self._checked = weakref.WeakSet()
            self._epoch = _handle.EPOCH
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
        if _PREPARE is not None and not any(c.rewired for c in self._contexts):
            need_alloc = self._prepare_in_c(backend, dev, cpu)
        else:
            need_alloc = self._prepare_in_python(backend, dev, cpu)
        if not place:
            return
        if need_alloc:
            buft = lib.ggml_backend_get_default_buffer_type(be)
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
        self._checked.add(backend)

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
        n = self.n_nodes
        addrs = np.frombuffer(ffi.buffer(lib.ggml_graph_nodes(self.ptr), 8 * n), np.uint64) \
            if n else np.zeros(0, np.uint64)
        bufs = np.zeros(n, np.uint64)
        datas = np.zeros(n, np.uint64)
        found = np.zeros(n, bool)
        own: list[int] = []
        for c in self._contexts:
            own += c.buffer_addresses()
            for lo, hi in c.spans():
                m = (addrs >= lo) & (addrs < hi)
                if m.any():
                    words = np.frombuffer(ffi.buffer(ffi.cast("char *", lo), hi - lo), np.uint64)
                    at = ((addrs[m] - np.uint64(lo)) // np.uint64(8)).astype(np.int64)
                    bufs[m] = words[at + _OFF_BUFFER]
                    datas[m] = words[at + _OFF_DATA]
                    found |= m
        for i in np.flatnonzero(~found):          # (none expected: nodes live in its contexts)
            t = ffi.cast(_TENSOR, int(addrs[i]))
            bufs[i], datas[i] = _addr(t.buffer), _addr(t.data)
        other = bufs != 0
        if len(own) > 16:
            other &= ~np.isin(bufs, np.array(own, np.uint64))
        elif other.any():                         # (a few buffers: cheaper than np.isin)
            for b in set(own):
                other &= bufs != np.uint64(b)
        return addrs, bufs, datas, other

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
        self._epoch = _handle.EPOCH

    def _prepare_in_c(self, backend: "Backend", dev: Any, cpu: Any) -> bool:
        """prepare's pass in one C call (ggml_build/helpers.c); True when nodes need memory."""
        n = self.n_nodes
        index_out = ffi.new("struct ggml_tensor *[]", max(n, 1))
        res = ffi.new("struct ggml_py_prep *")
        status = _PREPARE(self.ptr, backend.ptr, dev, ffi.NULL if cpu is None else cpu,
                          _GET_ROWS, _SET_ROWS, index_out, n, res)
        t = res.tensor
        if status == 1:
            self._unsupported(backend, t)
        elif status == 2:
            self._no_memory(t)
        elif status == 3:
            self._usable(backend, t, t.buffer, set())
        elif status == 4:
            check_status(lib.ggml_backend_view_init(t), "view init")
        if status:
            raise GGMLError(f"compute: preparing the graph failed (status {status})")
        self._indices()      # (every index node, not only those helpers.c found)
        return bool(res.need_alloc)

    def _prepare_in_python(self, backend: "Backend", dev: Any, cpu: Any) -> bool:
        """prepare's pass in Python (ABI-mode bindings, builds without the C helper, and
        graphs a scheduler rewired); True when nodes need memory."""
        supports = lib.ggml_backend_dev_supports_op
        usable: set[Any] = set()              # buffers the backend can use
        need_alloc = False
        index_nodes = []
        self.walk()
        assert self._nodes is not None
        for t in self._nodes:
            buf = t.buffer
            if not buf:
                src = t.view_src
                if src and src.buffer and src.data:
                    check_status(lib.ggml_backend_view_init(t), "view init")
                    buf = t.buffer
            if buf and buf not in usable:
                self._usable(backend, t, buf, usable)
            if not t.data:                    # views get their address from the allocator too
                need_alloc = True
            op = t.op
            if op != _OP_NONE and (not supports(dev, t) or cpu is not None and not supports(cpu, t)):
                self._unsupported(backend, t)
            if op == _GET_ROWS or op == _SET_ROWS:
                index_nodes.append(t)
        for t in self._leafs:
            if not t.data:
                self._no_memory(t)
            buf = t.buffer
            if buf and buf not in usable:
                self._usable(backend, t, buf, usable)
        if self._index_inputs is None:
            self._index_inputs = self._index_inputs_of(index_nodes)
        return need_alloc

    @staticmethod
    def _unsupported(backend: "Backend", t: Any) -> None:
        name = cstr(t.name) or cstr(lib.ggml_op_desc(t))
        raise UnsupportedError(f"compute: backend {backend.name} does not support "
                               f"op {cstr(lib.ggml_op_desc(t))} of node {name!r}")

    @staticmethod
    def _no_memory(t: Any) -> None:
        name = cstr(t.name) or cstr(lib.ggml_op_desc(t))
        raise InvalidArgument(f"compute: input tensor {name!r} has no memory: allocate "
                              "its context (ctx.alloc(backend)) and set its values first")

    @staticmethod
    def _usable(backend: "Backend", t: Any, buf: Any, usable: set[Any]) -> None:
        """InvalidArgument unless `backend` can use the buffer `buf` holding `t`."""
        buft = lib.ggml_backend_buffer_get_type(buf)
        if not lib.ggml_backend_supports_buft(backend.ptr, buft):
            name = cstr(t.name) or cstr(lib.ggml_op_desc(t))
            raise InvalidArgument(
                f"compute: tensor {name!r} lives in a "
                f"{cstr(lib.ggml_backend_buft_name(buft))} buffer, which backend "
                f"{backend.name} cannot use; copy it to that device or use a Scheduler")
        usable.add(buf)

    def _indices(self) -> list[tuple[Any, int, str]]:
        """(index tensor, rows it may address, op) for every get_rows/set_rows whose indices
        are a graph input: their values are checked at each compute (ggml asserts on a bad
        index, and an RPC server dies of it)."""
        if self._index_inputs is None:
            ops = (_GET_ROWS, _SET_ROWS)
            self._index_inputs = self._index_inputs_of(
                [t for t, is_node in self.walk() if is_node and t.op in ops])
        return self._index_inputs

    def _index_inputs_of(self, nodes: list[Any]) -> list[tuple[Any, int, str]]:
        """The leaves whose values are read as row numbers by the index nodes `nodes`
        (directly or through views and copies: ops.index.index_origin), with their bound."""
        out: list[tuple[Any, int, str]] = []
        for t in nodes:
            idx, rows, op = self._index_input(t)
            origin = index_origin(idx)
            if origin is None or (origin[1] is not None and origin[1] > rows):
                raise InvalidArgument(f"{op}: its indices have no known range (computed by op "
                                      f"{cstr(lib.ggml_op_desc(idx))}); feed them as an input")
            out.extend((leaf, rows, op) for leaf in origin[0])
        return out

    @staticmethod
    def _index_input(t: Any) -> tuple[Any, int, str]:
        """(index tensor, rows it may address, op) of a get_rows/set_rows node `t`."""
        # get_rows: src = (table, indices); set_rows: src = (rows, indices, destination)
        table = t.src[0] if int(t.op) == _GET_ROWS else t.src[2]
        return t.src[1], int(table.ne[1]), "get_rows" if int(t.op) == _GET_ROWS else "set_rows"

    def check_indices(self) -> None:
        """InvalidArgument when an index input holds a row number out of range."""
        for idx, rows, op in self._indices():
            if idx.data == ffi.NULL or idx.buffer == ffi.NULL:
                continue                  # reported as an unallocated input by prepare()
            dtype = np.int64 if int(idx.type) == int(lib.GGML_TYPE_I64) else np.int32
            values: Any = np.empty(int(lib.ggml_nelements(idx)), dtype)
            lib.ggml_backend_tensor_get(idx, ffi.from_buffer("void *", values, require_writable=True),
                                        0, values.nbytes)
            lo, hi = int(values.min()) if values.size else 0, int(values.max()) if values.size else 0
            if values.size and (lo < 0 or hi >= rows):
                bad = values[(values < 0) | (values >= rows)][0]
                raise InvalidArgument(f"{op}: index {bad} is out of range for {rows} rows "
                                      f"(indices {cstr(idx.name) or ''})")

    def compute_on(self, backend: "Backend", *, asynchronous: bool) -> None:
        """What ``backend.compute(graph)`` runs: checks, allocation, then ggml's compute."""
        if len(self._contexts) == 1:
            ctx = self._contexts[0]
            with backend._lock, ctx._lock:
                fast = self._fast
                if (fast is not None and self._fast_epoch == _handle.EPOCH and not asynchronous
                        and fast() is backend and not ctx.rewired):
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
            stack.enter_context(backend._lock)
            for c in sorted(self._contexts, key=id):
                stack.enter_context(c._lock)
            self._compute_locked(backend, asynchronous)

    def _compute_locked(self, backend: "Backend", asynchronous: bool) -> None:
        backend.ensure_alive()
        if any(c.rewired for c in self._contexts):      # a scheduler's copies (rare)
            give_back_rewired({id(c): c for c in self._contexts})
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
        self._fast_epoch = self._epoch

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
