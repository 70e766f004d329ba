"""Compute graphs: ``ggml_new_graph_custom``, ``ggml_build_forward_expand``, compute on a backend.

    >>> g = gg.Graph(out)                          # doctest: +SKIP
    >>> be.compute(g); out.numpy()

Before a graph reaches ggml it is checked: every leaf must hold data, every tensor that holds
data must sit in a buffer the backend can use, and the backend must support every op.
Nodes without memory are placed by ggml's graph allocator (``ggml_gallocr``); that memory
stays valid as long as the graph's context lives.
"""
from __future__ import annotations

import weakref

from ._handle import Owned
from ._loader import cstr, ffi, lib
from .errors import ClosedError, GGMLError, InvalidArgument, UnsupportedError, check, require
from .registry import free_guard
from .tensor import Context, Tensor, contexts_of


class _GraphMemory(Owned):
    _kind = "graph"


class Graph:
    """A forward graph over `outputs` (a tensor or a list of tensors)."""

    def __init__(self, outputs, *, capacity: int | None = None):
        outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
        require(outs and all(isinstance(t, Tensor) for t in outs), "Graph needs output tensors")
        self.outputs = outs
        self.ctx = outs[0].ctx
        count = _count_nodes(outs)
        require(capacity is None or (isinstance(capacity, int) and capacity >= count),
                f"capacity {capacity!r} cannot hold this graph's {count} tensors (leave it out: "
                "the capacity follows the graph)")
        n = capacity or max(int(lib.GGML_DEFAULT_GRAPH_SIZE), 2 * count + 16)
        overhead = int(lib.ggml_graph_overhead_custom(n, False))
        params = ffi.new("struct ggml_init_params *",
                         {"mem_size": overhead + 1024, "mem_buffer": ffi.NULL, "no_alloc": True})
        raw = lib.ggml_init(params[0])
        if raw == ffi.NULL:
            raise GGMLError("ggml_init failed for the graph")
        self._meta = _GraphMemory(raw, lib.ggml_free, parents=(self.ctx,))
        self.ptr = lib.ggml_new_graph_custom(raw, n, False)
        for t in outs:
            lib.ggml_set_output(t.ptr)
            lib.ggml_build_forward_expand(self.ptr, t.ptr)
        self._allocs = {}
        # every context holding a node or leaf: a closed one would leave the graph pointing
        # into freed memory, so computing then raises instead
        self._contexts = contexts_of(t for t, _ in _walk(self))
        self._checked = weakref.WeakSet()   # backends this graph was validated and allocated for
        self._index_inputs = None           # get_rows/set_rows indices to range-check
        self.ctx._keep.append(self)  # node memory placed by the allocator lives with the context

    @property
    def n_nodes(self) -> int:
        return int(lib.ggml_graph_n_nodes(self.ptr))

    @property
    def nodes(self) -> list[Tensor]:
        return [Tensor(lib.ggml_graph_node(self.ptr, i), self.ctx) for i in range(self.n_nodes)]

    @property
    def leafs(self) -> list[Tensor]:
        """Inputs and constants: sources of nodes that are not nodes themselves."""
        return [Tensor(t, self.ctx) for t, is_node in _walk(self) if not is_node]

    def to_dot(self, path: str | None = None) -> str:
        """Graphviz text of the graph (ggml_graph_dump_dot); written to `path` when given."""
        import os
        import tempfile
        fd, tmp = tempfile.mkstemp(suffix=".dot")
        os.close(fd)
        try:
            lib.ggml_graph_dump_dot(self.ptr, ffi.NULL, tmp.encode())
            text = open(tmp).read()
        finally:
            os.unlink(tmp)
        if path:
            with open(path, "w") as f:
                f.write(text)
        return text

    def to_svg(self) -> str:
        """The graph as an SVG picture, drawn here (no Graphviz needed): inputs at the top,
        each node one row below its lowest source. Jupyter shows a Graph as this picture."""
        entries = list(_walk(self))
        key = lambda p: int(ffi.cast("uintptr_t", p))   # noqa: E731
        depth, label = {}, {}
        for t, is_node in entries[::-1]:                 # leafs first
            if not is_node:
                depth[key(t)] = 0
        for t, is_node in entries:                       # nodes come in dependency order
            if is_node:
                srcs = [key(s) for s in t.src if s != ffi.NULL]
                depth[key(t)] = 1 + max((depth.get(k, 0) for k in srcs), default=0)
        rows: dict[int, list] = {}
        for t, is_node in entries:
            k = key(t)
            rows.setdefault(depth[k], []).append(t)
            shape = "x".join(str(int(n)) for n in reversed(list(t.ne)[:max(1, int(lib.ggml_n_dims(t)))]))
            top = cstr(lib.ggml_op_desc(t)) if is_node else (cstr(t.name) or "input")
            label[k] = (top, f"{cstr(lib.ggml_type_name(t.type))} [{shape}]", is_node)
        bw, bh, gx, gy = 150, 38, 24, 40
        width = max(len(r) for r in rows.values()) * (bw + gx) + gx
        height = len(rows) * (bh + gy) + gy
        pos = {}
        for d, row in rows.items():
            x0 = (width - len(row) * (bw + gx) + gx) / 2
            for i, t in enumerate(row):
                pos[key(t)] = (x0 + i * (bw + gx), gy + d * (bh + gy))
        esc = lambda s: s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # noqa: E731
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
               'font-family="monospace" font-size="11">']
        for t, is_node in entries:
            if not is_node:
                continue
            x, y = pos[key(t)]
            for s in t.src:
                if s != ffi.NULL and key(s) in pos:
                    sx, sy = pos[key(s)]
                    out.append(f'<line x1="{sx + bw / 2:.0f}" y1="{sy + bh:.0f}" x2="{x + bw / 2:.0f}" '
                               f'y2="{y:.0f}" stroke="#888"/>')
        for k, (x, y) in pos.items():
            top, bottom, is_node = label[k]
            fill = "#dbe9ff" if is_node else "#e8f5d8"
            out.append(f'<rect x="{x:.0f}" y="{y:.0f}" width="{bw}" height="{bh}" rx="5" '
                       f'fill="{fill}" stroke="#446"/>')
            out.append(f'<text x="{x + bw / 2:.0f}" y="{y + 15:.0f}" text-anchor="middle">{esc(top[:22])}</text>')
            out.append(f'<text x="{x + bw / 2:.0f}" y="{y + 30:.0f}" text-anchor="middle" '
                       f'fill="#555">{esc(bottom[:24])}</text>')
        out.append("</svg>")
        return "\n".join(out)

    def _repr_svg_(self) -> str:
        return self.to_svg()

    def __repr__(self):
        return f"<Graph nodes={self.n_nodes} outputs={len(self.outputs)}>"


def _count_nodes(outs) -> int:
    seen, stack = set(), list(outs)
    while stack:
        t = stack.pop()
        key = int(ffi.cast("uintptr_t", t._p))
        if key in seen:
            continue
        seen.add(key)
        stack.extend(t.src)
    return len(seen)


def _walk(graph: Graph):
    """(raw tensor, is_node) for every node, then every leaf (a source that is no node).

    ``struct ggml_cgraph`` is opaque in the public headers, so leafs are found through the
    nodes' sources."""
    nodes = [lib.ggml_graph_node(graph.ptr, i) for i in range(graph.n_nodes)]
    keys = {int(ffi.cast("uintptr_t", n)) for n in nodes}
    for n in nodes:
        yield n, True
    seen = set()
    for n in nodes:
        for s in n.src:
            k = int(ffi.cast("uintptr_t", s))
            if s != ffi.NULL and k not in keys and k not in seen:
                seen.add(k)
                yield s, False


def init_views(graph: Graph) -> None:
    """Give views made after their source was allocated the source's buffer (ggml sets their
    address but not their buffer; the allocator skips tensors that have an address)."""
    for t, is_node in _walk(graph):
        src = t.view_src
        if is_node and t.buffer == ffi.NULL and src != ffi.NULL and src.buffer != ffi.NULL \
                and src.data != ffi.NULL:
            check(lib.ggml_backend_view_init(t), "view init")


def require_open(graph: Graph) -> None:
    graph._meta.ptr
    for c in graph._contexts:
        if c.closed:
            raise ClosedError("a context holding tensors of this graph was closed")


def prepare(backend, graph: Graph) -> None:
    """Validate `graph` for `backend` and allocate nodes that have no memory yet.

    A graph cannot change once built, so this walk runs once per backend: later computes of
    the same graph cost no Python work per node."""
    require_open(graph)
    be = backend.ptr
    if backend in graph._checked:
        return
    init_views(graph)
    need_alloc = False
    for t, is_node in _walk(graph):
        name = cstr(t.name) or cstr(lib.ggml_op_desc(t))
        if not is_node and t.data == ffi.NULL:
            raise InvalidArgument(f"input tensor {name!r} has no memory: allocate its context "
                                  "(ctx.alloc(backend)) and set its values before computing")
        if t.buffer != ffi.NULL:
            buft = lib.ggml_backend_buffer_get_type(t.buffer)
            if not lib.ggml_backend_supports_buft(be, buft):
                raise InvalidArgument(
                    f"tensor {name!r} lives in a {cstr(lib.ggml_backend_buft_name(buft))} buffer, "
                    f"which backend {backend.name} cannot use; copy it to that device or "
                    "use a Scheduler")
        if is_node:
            if t.data == ffi.NULL:        # views get their address from the allocator too
                need_alloc = True
            if int(t.op) != int(lib.GGML_OP_NONE) and not lib.ggml_backend_supports_op(be, t):
                raise UnsupportedError(f"backend {backend.name} does not support op "
                                       f"{cstr(lib.ggml_op_desc(t))} of node {name!r}")
    if need_alloc:
        buft = lib.ggml_backend_get_default_buffer_type(be)
        key = int(ffi.cast("uintptr_t", buft))
        alloc = graph._allocs.get(key)
        if alloc is None:
            raw = lib.ggml_gallocr_new(buft)
            if raw == ffi.NULL:
                raise GGMLError("ggml_gallocr_new failed")
            alloc = graph._allocs[key] = Owned(
                raw, lib.ggml_gallocr_free, parents=(graph.ctx,),
                guard=free_guard(lib.ggml_backend_buft_get_device(buft)))
        if not lib.ggml_gallocr_alloc_graph(alloc.ptr, graph.ptr):
            raise GGMLError(f"allocating the graph's nodes on {backend.name} failed (out of memory?)")
    graph._checked.add(backend)


def _index_inputs(graph: Graph) -> list:
    """(index tensor, rows it may address, op) for every get_rows/set_rows whose indices are a
    graph input: their values are checked at each compute (ggml asserts on a bad index, and
    an RPC server dies of it)."""
    if graph._index_inputs is None:
        found, nodes = [], {int(ffi.cast("uintptr_t", t)) for t, n in _walk(graph) if n}
        get_rows, set_rows = int(lib.GGML_OP_GET_ROWS), int(lib.GGML_OP_SET_ROWS)
        for t, is_node in _walk(graph):
            if not is_node or int(t.op) not in (get_rows, set_rows):
                continue
            # get_rows: src = (table, indices); set_rows: src = (rows, indices, destination)
            idx = t.src[1]
            table = t.src[0] if int(t.op) == get_rows else t.src[2]
            if int(ffi.cast("uintptr_t", idx)) not in nodes:
                found.append((idx, int(table.ne[1]), "get_rows" if int(t.op) == get_rows else "set_rows"))
        graph._index_inputs = found
    return graph._index_inputs


def check_indices(graph: Graph) -> None:
    import numpy as np
    for idx, rows, op in _index_inputs(graph):
        if idx.data == ffi.NULL or idx.buffer == ffi.NULL:
            continue                      # reported as an unallocated input by prepare()
        dtype = np.int64 if int(idx.type) == int(lib.GGML_TYPE_I64) else np.int32
        values = np.empty(int(lib.ggml_nelements(idx)), dtype)
        lib.ggml_backend_tensor_get(idx, ffi.from_buffer("void *", values, require_writable=True),
                                    0, values.nbytes)
        if values.size and (values.min() < 0 or values.max() >= rows):
            bad = values[(values < 0) | (values >= rows)][0]
            raise InvalidArgument(f"{op}: index {bad} is out of range for {rows} rows "
                                  f"(indices {cstr(idx.name) or ''})")


def compute(backend, graph: Graph, *, asynchronous: bool) -> None:
    backend._alive()
    prepare(backend, graph)
    check_indices(graph)
    if asynchronous:
        backend._pending.append(graph)
        check(lib.ggml_backend_graph_compute_async(backend.ptr, graph.ptr), "graph compute")
    else:
        check(lib.ggml_backend_graph_compute(backend.ptr, graph.ptr), "graph compute")
