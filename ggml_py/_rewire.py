"""Scheduler rewiring, in one place: the split nodes whose sources a scheduler points at copies.

When ggml's scheduler splits a graph across backends it points the sources of split nodes at
copies in its own context, until its next split, and frees the copies with the scheduler.
Everything else must see a node's own sources (``Tensor.src``, graph walks, a new graph, another
scheduler's split), so the rewiring is recorded twice:

- a scheduler keeps a :class:`Splits`: the graphs it placed with every node's own sources, to
  put back (:meth:`Splits.give_back`);
- each context holding a split node keeps a :class:`Record` (``Context.rewired``: node address
  -> the Splits that rewired it and the node's own sources), so the record lives and dies with
  the contexts (no global keeping them alive).

The rest of the package asks through three functions: :func:`own_sources`, :func:`rewired`
and :func:`give_back`.
"""
from __future__ import annotations

from typing import Any, Iterable, Protocol, Sequence

from ._loader import ffi, lib

MAX_SRC = int(lib.GGML_MAX_SRC)

# (raw node, its own sources as its op built them: GGML_MAX_SRC entries, NULL ones included)
Sources = list[tuple[Any, list[Any]]]


class Record(dict[int, tuple["Splits", list[Any]]]):
    """A context's record of its rewired nodes: node address -> (the Splits that rewired it,
    the node's own sources). A dict, so that ``bool(ctx.rewired)`` costs nothing on the
    compute fast path."""


class Rewirable(Protocol):
    """What rewiring asks of a context: its record and whether it closed."""

    rewired: Record

    @property
    def closed(self) -> bool: ...


def _addr(p: Any) -> int:
    return int(ffi.cast("uintptr_t", p))


def sources_of(nodes: Iterable[Any]) -> Sources:
    """Every node of `nodes` with its sources as they are now (before a split rewires them)."""
    return [(t, [t.src[j] for j in range(MAX_SRC)]) for t in nodes]


def restore(sources: Sources) -> None:
    """Point each node at the sources recorded for it."""
    for t, srcs in sources:
        for j, s in enumerate(srcs):
            t.src[j] = s


def own_sources(p: Any, contexts: Iterable[Rewirable]) -> list[Any]:
    """The raw sources of the raw tensor `p` as its op built them (NULL entries included);
    `contexts`: those that may hold a record of `p` (its own, or a graph's)."""
    for c in contexts:
        if c.rewired:
            entry = c.rewired.get(_addr(p))
            if entry is not None:
                return entry[1]
    return list(p.src)


def rewired(contexts: Iterable[Rewirable]) -> bool:
    """Whether a node of `contexts` reads a scheduler's copies."""
    return any(c.rewired for c in contexts)


def give_back(contexts: Iterable[Rewirable]) -> None:
    """Before ggml walks a graph with tensors in `contexts`: every scheduler that points nodes
    there at its copies gives them their own sources back (it splits again next time)."""
    contexts = list(contexts)
    splits = {id(e[0]): e[0] for c in contexts if c.rewired for e in list(c.rewired.values())}
    if splits:
        ids = {id(c) for c in contexts}
        for s in splits.values():
            s.give_back(ids)


class Splits:
    """One scheduler's rewiring: the graphs it placed (by their contexts) with every node's own
    sources, and whether ggml's split points some of them at its copies now."""

    __slots__ = ("_placed", "active")

    def __init__(self) -> None:
        self._placed: list[tuple[list[Rewirable], Sources]] = []
        self.active = False        # some node of a placed graph reads the scheduler's copies

    def placing(self, contexts: Sequence[Rewirable], sources: Sources) -> None:
        """A graph with tensors in `contexts` is about to be split; `sources`: its nodes'."""
        self._placed.append((list(contexts), sources))

    def split(self, contexts: Sequence[Rewirable], sources: Sources) -> int:
        """After ggml split the graph: record the nodes it rewired on `contexts`; the number of
        tensors it copies between backends."""
        copied: set[int] = set()
        for t, srcs in sources:
            if any(a != b for a, b in zip(t.src, srcs)):
                copied.update(_addr(a) for a, b in zip(t.src, srcs) if a != b)
                for c in contexts:       # (one of them holds the node)
                    c.rewired[_addr(t)] = (self, srcs)
        self.active = True
        return len(copied)

    def give_back(self, contexts: set[int] | None = None) -> None:
        """Point the split nodes of the placed graphs at their own sources again (all of them,
        or only where a graph has a tensor in a context whose id is in `contexts`). Node
        memory stays as placed."""
        if not self.active:
            return
        if contexts is not None and not any(
                id(c) in contexts for cs, _ in self._placed for c in cs):
            return
        self.active = False
        for cs, sources in self._placed:
            for t, _ in sources:
                for c in cs:
                    c.rewired.pop(_addr(t), None)
            if not any(c.closed for c in cs):   # (else its tensors are gone)
                restore(sources)

    def clear(self) -> None:
        """Forget the placed graphs (after :meth:`give_back`)."""
        self._placed = []


__all__ = ["Record", "Rewirable", "Splits", "give_back", "own_sources", "restore", "rewired",
           "sources_of"]
