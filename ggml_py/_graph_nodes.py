"""A graph's tensors read straight from ggml's records: what a graph reaches, and where its
nodes live.

Graph construction bounds and checks what the outputs reach on raw pointers (no Tensor object
per tensor); placement reads every node's buffer and data address as numpy arrays over the
contexts' chunks (no Python work per node).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._loader import ffi, lib
from .errors import ClosedError

if TYPE_CHECKING:
    from ._context import Context

_OFF_BUFFER = ffi.offsetof("struct ggml_tensor", "buffer") // 8   # (in 8-byte words)
_OFF_DATA = ffi.offsetof("struct ggml_tensor", "data") // 8
_TENSOR = ffi.typeof("struct ggml_tensor *")


def addr(p: Any) -> int:
    """The address of the raw tensor `p`."""
    return int(ffi.cast("uintptr_t", p))


def count_nodes(outs: list[Any]) -> int:
    """Tensors reachable from `outs` (an upper bound of nodes + leafs), on raw pointers."""
    seen: set[int] = set()
    stack = list(outs)
    null = ffi.NULL
    while stack:
        p = stack.pop()
        k = addr(p)
        if k in seen:
            continue
        seen.add(k)
        for s in p.src:            # (new graphs give split nodes their sources back first)
            if s != null:
                stack.append(s)
    return len(seen)


def refuse_closed_operands(outs: list[Any], closed: list["Context"]) -> None:
    """ClosedError when a tensor the graph reaches lives in a closed context (ggml would walk
    freed memory). Only run when a context the outputs' contexts use was closed: a walk that
    never reads a tensor of a closed context, so a graph that does not reach one is built."""
    seen: set[int] = set()
    stack = list(outs)
    null = ffi.NULL
    while stack:
        p = stack.pop()
        k = addr(p)
        if k in seen:
            continue
        seen.add(k)
        if any(c.owns(p) for c in closed):
            raise ClosedError("Graph: a tensor this graph reads lives in a closed context "
                              "(close a context only after the tensors built from it)")
        for s in (*p.src, p.view_src):
            if s != null:
                stack.append(s)


def node_memory(graph: Any, n: int, contexts: list["Context"]) -> tuple[Any, Any, Any, Any]:
    """(addresses, buffers, data addresses, `other`) of the `n` nodes of the raw `graph`, as
    numpy arrays read from the tensor records of `contexts` (the graph's); `other`: the nodes
    whose memory is not a buffer of those contexts (an allocator or scheduler placed it)."""
    addrs = np.frombuffer(ffi.buffer(lib.ggml_graph_nodes(graph), 8 * n), np.uint64) \
        if n else np.zeros(0, np.uint64)
    bufs = np.zeros(n, np.uint64)
    datas = np.zeros(n, np.uint64)
    found = np.zeros(n, bool)
    own: list[int] = []
    for c in contexts:
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
        bufs[i], datas[i] = addr(t.buffer), addr(t.data)
    other = bufs != 0
    if len(own) > 16:
        other &= ~np.isin(bufs, np.array(own, np.uint64))
    elif other.any():                         # (a few buffers: cheaper than np.isin)
        for b in set(own):
            other &= bufs != np.uint64(b)
    return addrs, bufs, datas, other


__all__ = ["addr", "count_nodes", "node_memory", "refuse_closed_operands"]
