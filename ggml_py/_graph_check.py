"""The checks a graph passes before ggml computes it on a backend (``Graph.prepare``).

ggml aborts, or an RPC server dies, on what these refuse: an op the backend (or, for an RPC
device, the CPU as well) does not support, a leaf without memory, a tensor in a buffer the
backend cannot use, an index out of range. One pass over the nodes and one over the leafs,
in C (``ggml_build/helpers.c``) where the bindings have the helper, in Python otherwise; the
index inputs, found once, are range-checked at every compute.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._loader import cstr, ffi, lib
from .ops.index import index_origin
from .errors import GGMLError, InvalidArgument, UnsupportedError, check_status

if TYPE_CHECKING:
    from ._backend import Backend

GET_ROWS, SET_ROWS = int(lib.GGML_OP_GET_ROWS), int(lib.GGML_OP_SET_ROWS)
_OP_NONE = int(lib.GGML_OP_NONE)

# (index tensor, rows it may address, op name)
IndexInput = tuple[Any, int, str]


def unsupported(backend: "Backend", t: Any) -> None:
    """UnsupportedError: `backend` cannot run the op of node `t`."""
    name = cstr(t.name) or cstr(lib.ggml_op_desc(t))
    raise UnsupportedError(f"compute: backend {backend.name} does not support "
                           f"op {cstr(lib.ggml_op_desc(t))} of node {name!r}")


def no_memory(t: Any) -> None:
    """InvalidArgument: the leaf `t` has no memory."""
    name = cstr(t.name) or cstr(lib.ggml_op_desc(t))
    raise InvalidArgument(f"compute: input tensor {name!r} has no memory: allocate "
                          "its context (ctx.alloc(backend)) and set its values first")


def usable(backend: "Backend", t: Any, buf: Any, seen: set[Any]) -> None:
    """InvalidArgument unless `backend` can use the buffer `buf` holding `t`; `seen` gathers
    the buffers found usable."""
    buft = lib.ggml_backend_buffer_get_type(buf)
    if not lib.ggml_backend_supports_buft(backend.ptr, buft):
        name = cstr(t.name) or cstr(lib.ggml_op_desc(t))
        raise InvalidArgument(
            f"compute: tensor {name!r} lives in a "
            f"{cstr(lib.ggml_backend_buft_name(buft))} buffer, which backend "
            f"{backend.name} cannot use; copy it to that device or use a Scheduler")
    seen.add(buf)


def in_c(prepare: Any, graph: Any, n_nodes: int, backend: "Backend", dev: Any,
         cpu: Any) -> bool:
    """The pass in one C call `prepare` (helpers.c's ggml_py_prepare) over the raw graph;
    True when nodes need memory."""
    index_out = ffi.new("struct ggml_tensor *[]", max(n_nodes, 1))
    res = ffi.new("struct ggml_py_prep *")
    status = prepare(graph, backend.ptr, dev, ffi.NULL if cpu is None else cpu,
                     GET_ROWS, SET_ROWS, index_out, n_nodes, res)
    t = res.tensor
    if status == 1:
        unsupported(backend, t)
    elif status == 2:
        no_memory(t)
    elif status == 3:
        usable(backend, t, t.buffer, set())
    elif status == 4:
        check_status(lib.ggml_backend_view_init(t), "view init")
    if status:
        raise GGMLError(f"compute: preparing the graph failed (status {status})")
    return bool(res.need_alloc)


def in_python(nodes: list[Any], leafs: list[Any], backend: "Backend", dev: Any,
              cpu: Any) -> tuple[bool, list[Any]]:
    """The pass in Python (ABI-mode bindings, builds without the C helper, and graphs a
    scheduler rewired): (whether nodes need memory, the index nodes)."""
    supports = lib.ggml_backend_dev_supports_op
    seen: set[Any] = set()                # buffers the backend can use
    need_alloc = False
    index_nodes = []
    for t in nodes:
        buf = t.buffer
        if not buf:
            src = t.view_src
            if src and src.buffer and src.data:
                check_status(lib.ggml_backend_view_init(t), "view init")
                buf = t.buffer
        if buf and buf not in seen:
            usable(backend, t, buf, seen)
        if not t.data:                    # views get their address from the allocator too
            need_alloc = True
        op = t.op
        if op != _OP_NONE and (not supports(dev, t) or cpu is not None and not supports(cpu, t)):
            unsupported(backend, t)
        if op == GET_ROWS or op == SET_ROWS:
            index_nodes.append(t)
    for t in leafs:
        if not t.data:
            no_memory(t)
        buf = t.buffer
        if buf and buf not in seen:
            usable(backend, t, buf, seen)
    return need_alloc, index_nodes


def _index_input(t: Any) -> IndexInput:
    """(index tensor, rows it may address, op) of a get_rows/set_rows node `t`."""
    # get_rows: src = (table, indices); set_rows: src = (rows, indices, destination)
    table = t.src[0] if int(t.op) == GET_ROWS else t.src[2]
    return t.src[1], int(table.ne[1]), "get_rows" if int(t.op) == GET_ROWS else "set_rows"


def index_inputs(nodes: list[Any]) -> list[IndexInput]:
    """The leaves whose values are read as row numbers by the index nodes `nodes`
    (directly or through views and copies: ops.index.index_origin), with their bound."""
    out: list[IndexInput] = []
    for t in nodes:
        idx, rows, op = _index_input(t)
        origin = index_origin(idx)
        if origin is None or (origin[1] is not None and origin[1] > rows):
            raise InvalidArgument(f"{op}: its indices have no known range (computed by op "
                                  f"{cstr(lib.ggml_op_desc(idx))}); feed them as an input")
        out.extend((leaf, rows, op) for leaf in origin[0])
    return out


def check_indices(inputs: list[IndexInput]) -> None:
    """InvalidArgument when an index input holds a row number out of range."""
    for idx, rows, op in inputs:
        if idx.data == ffi.NULL or idx.buffer == ffi.NULL:
            continue                  # reported as an unallocated input by the passes above
        dtype = np.int64 if int(idx.type) == int(lib.GGML_TYPE_I64) else np.int32
        values: Any = np.empty(int(lib.ggml_nelements(idx)), dtype)
        lib.ggml_backend_tensor_get(idx, ffi.from_buffer("void *", values, require_writable=True),
                                    0, values.nbytes)
        lo, hi = int(values.min()) if values.size else 0, int(values.max()) if values.size else 0
        if values.size and (lo < 0 or hi >= rows):
            bad = values[(values < 0) | (values >= rows)][0]
            raise InvalidArgument(f"{op}: index {bad} is out of range for {rows} rows "
                                  f"(indices {cstr(idx.name) or ''})")


__all__ = ["IndexInput", "check_indices", "in_c", "in_python", "index_inputs", "no_memory",
           "unsupported", "usable"]
