"""Which tensors hold values someone wrote: reading memory no one wrote raises.

ggml hands out memory as it is: a node no graph computed, or a tensor allocated and never set,
reads whatever the buffer held (values like -1.1e11 and 4.6e-41). Each context keeps the books
of its tensors (:class:`Books`, ``Context.books``):

- a **write** (``set``, ``set_async``, a copy into it, a GGUF load, ``from_numpy``'s values at
  alloc) records the tensor with the address of its memory at that time: memory placed again
  (elsewhere) reads as unwritten again;
- a **compute** records the graph's nodes and the tensors its view nodes write into (a
  ``cpy``'s destination, an in-place op's target), on the compute's slow path, which walks
  them anyway: the hot path of a recompute is untouched;
- a read (``numpy()``, ``Backend.get``, ``get_async``) of a tensor found in neither raises
  :class:`~ggml_py.errors.UnwrittenError`. A view counts as written when the tensor it views
  does. ``t.raw_numpy()`` reads the raw memory on purpose.
"""
from __future__ import annotations

from typing import Any

from ._interfaces import TensorLike
from ._loader import ffi, lib
from .errors import UnwrittenError


class Books:
    """A context's record of its tensors that hold written values."""

    __slots__ = ("wrote", "nodes")

    def __init__(self) -> None:
        # raw tensor (cffi pointers hash by address) -> its data pointer when written
        self.wrote: dict[Any, Any] = {}
        # addresses of the nodes of graphs computed over it (each compute writes them)
        self.nodes: set[int] = set()


def wrote(t: TensorLike) -> None:
    """Record that `t`'s memory now holds values (after a set, a copy, a load)."""
    p = t._p
    t.ctx.books.wrote[p] = p.data
    if p.view_src:                       # (rare) the tensor it views holds them too
        owner = _owner(t.ctx, p.view_src)
        if owner is not None:
            owner.books.wrote[p.view_src] = p.view_src.data


# buffers cleared (Buffer.clear): (buffer address, base address), so that a buffer freed and
# another made at the same address reads as not cleared
_CLEARED: set[tuple[int, int]] = set()


def _key(buf: Any) -> tuple[int, int]:
    return (int(ffi.cast("uintptr_t", buf)),
            int(ffi.cast("uintptr_t", lib.ggml_backend_buffer_get_base(buf))))


def cleared(buf: Any) -> None:
    """Record that every byte of the raw buffer `buf` was set (``Buffer.clear``)."""
    _CLEARED.add(_key(buf))


def ran(graph: Any, contexts: Any) -> None:
    """Record that `graph` computed: its nodes hold values (called on the compute's slow
    path, which already walked every node: a recompute's fast path does not come here)."""
    nodes = graph.written_addresses()
    for c in contexts:
        c.books.nodes |= nodes


def _owner(ctx: Any, raw: Any) -> Any:
    for c in ctx.contexts(include_closed=False):
        if c.owns(raw):
            return c
    return None


def _holds(ctx: Any, p: Any) -> bool:
    books = ctx.books
    d = books.wrote.get(p)
    if d is not None and d == p.data:
        return True
    if books.nodes and int(ffi.cast("uintptr_t", p)) in books.nodes:
        return True
    return bool(_CLEARED) and bool(p.buffer) and _key(p.buffer) in _CLEARED


def require_written(t: TensorLike, what: str) -> None:
    """UnwrittenError unless something wrote `t` (or the tensor it views) since its memory
    was placed."""
    p = t._p
    d = t.ctx.books.wrote.get(p)
    if d is not None and d == p.data:         # (the usual case: one lookup)
        return
    if _holds(t.ctx, p):
        return
    src = p.view_src
    if src:
        owner = _owner(t.ctx, src)
        if owner is not None and _holds(owner, src):
            return
    raise UnwrittenError(
        f"{what}: tensor {t.name or '(unnamed)'} holds no values: nothing set, loaded, copied "
        "or computed it since its memory was placed (compute its graph or set it first; "
        "t.raw_numpy() reads the raw memory on purpose)")


__all__ = ["Books", "wrote", "ran", "require_written"]
