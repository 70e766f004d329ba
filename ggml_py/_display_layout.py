"""The layout of a layered drawing (the graph picture of :mod:`ggml_py._display_graph`).

Vertices are ints: a graph's nodes 0..n-1 in ggml's order, then its leafs, then one small
placeholder per row a long edge crosses, so every edge runs between rows or beside boxes,
never through one. Each node sits one row below its lowest operand, each input right above
its first consumer; rows are ordered by the barycenters of their neighbours and boxes pulled
toward them. Nothing here knows ggml: it places boxes of given widths.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

Edge = tuple[int, int]


def layers(n_nodes: int, n_all: int, edges: list[Edge], copied: dict[int, str]
            ) -> dict[int, int]:
    """Rows of vertices 0..n_all-1 (nodes first, in ggml's dependency order, then leafs):
    nodes by longest path from the inputs (a scheduler's copy right below its source, before
    its first consumer); each other input right above its first consumer."""
    preds: dict[int, list[int]] = {v: [] for v in range(n_all)}
    succs: dict[int, list[int]] = {v: [] for v in range(n_all)}
    for s, d in edges:
        preds[d].append(s)
        succs[s].append(d)
    layer = {v: 0 for v in range(n_nodes, n_all)}
    done = set(range(n_nodes, n_all)) - set(copied)
    for n in range(n_nodes):
        for s in preds[n]:
            if s not in done:    # a copy, placed once its source is
                layer[s] = 1 + max((layer[p] for p in preds[s]), default=-1)
                done.add(s)
        layer[n] = 1 + max((layer[s] for s in preds[n]), default=0)
    for leaf in range(n_nodes, n_all):
        if leaf in copied and preds[leaf]:
            continue
        if succs[leaf]:
            layer[leaf] = min(layer[d] for d in succs[leaf]) - 1
    return layer


def copy_sources(copies: dict[int, str], placed: dict[int, str], names: list[str]
                  ) -> dict[int, int]:
    """{copy: its source} (vertex ids) where the source's name and backend tell it apart."""
    found = {}
    for c, src in copies.items():
        match = [v for v, name in enumerate(names) if v not in copies and name == src
                 and placed.get(v) not in (None, placed[c])]
        if len(match) == 1:
            found[c] = match[0]
    return found


def _order(rows: list[list[int]], up: dict[int, list[int]], down: dict[int, list[int]],
           sweeps: int = 4) -> list[list[int]]:
    """Barycenter ordering of each row, sweeping down then up (fewer crossings)."""
    pos = {v: i for row in rows for i, v in enumerate(row)}
    for _ in range(sweeps):
        for seq, nbrs in ((range(1, len(rows)), up), (range(len(rows) - 2, -1, -1), down)):
            for r in seq:
                keyed = []
                for i, v in enumerate(rows[r]):
                    ns = nbrs.get(v, [])
                    keyed.append((sum(pos[n] for n in ns) / len(ns) if ns else i, i))
                rows[r] = [rows[r][i] for i in sorted(range(len(rows[r])), key=keyed.__getitem__)]
                pos.update((v, i) for i, v in enumerate(rows[r]))
    return rows


def _place_x(rows: list[list[int]], width: dict[int, float], up: dict[int, list[int]],
             down: dict[int, list[int]], gap: float = 22.0, sweeps: int = 4) -> dict[int, float]:
    """x centres: each vertex pulled toward its neighbours' mean, rows kept in order with
    room between boxes (left-to-right and right-to-left packing, averaged)."""
    x = {}
    for row in rows:
        acc = 0.0
        for v in row:
            x[v] = acc + width[v] / 2
            acc += width[v] + gap
    for it in range(sweeps * 2):
        nbrs = up if it % 2 == 0 else down
        order = range(len(rows)) if it % 2 == 0 else range(len(rows) - 1, -1, -1)
        for r in order:
            row = rows[r]
            want = [sum(x[n] for n in nbrs[v]) / len(nbrs[v]) if nbrs.get(v) else x[v] for v in row]
            left, right = want[:], want[:]
            for i in range(1, len(row)):
                sep = (width[row[i - 1]] + width[row[i]]) / 2 + gap
                left[i] = max(left[i], left[i - 1] + sep)
            for i in range(len(row) - 2, -1, -1):
                sep = (width[row[i]] + width[row[i + 1]]) / 2 + gap
                right[i] = min(right[i], right[i + 1] - sep)
            for i, v in enumerate(row):
                x[v] = (left[i] + right[i]) / 2
    return x


@dataclass
class Layout:
    """Where each vertex goes: its row (`layer`), width and centre (`x`, `y` of its top), and
    each edge as the chain of vertices it passes through."""

    layer: dict[int, int]
    width: dict[int, float]
    chains: list[list[int]] = field(default_factory=list)
    x: dict[int, float] = field(default_factory=dict)
    y: dict[int, float] = field(default_factory=dict)
    n_rows: int = 0


def place(n_nodes: int, n_all: int, edges: list[Edge], layer: dict[int, int],
          width: dict[int, float], *, box_h: float, row_gap: float, margin: float,
          top: float) -> Layout:
    """Route `edges` through placeholders, order the rows and give every vertex its place;
    `layer` and `width` (of vertices 0..n_all-1) gain the placeholders'."""
    lay = Layout(layer, width)
    up: dict[int, list[int]] = {}
    down: dict[int, list[int]] = {}
    dummies = itertools.count(n_all)
    for s, d in edges:
        chain = [s]
        for r in range(layer[s] + 1, layer[d]):
            v = next(dummies)
            layer[v], width[v] = r, 8
            chain.append(v)
        chain.append(d)
        lay.chains.append(chain)
        for upper, lower in zip(chain, chain[1:]):
            up.setdefault(lower, []).append(upper)
            down.setdefault(upper, []).append(lower)
    lay.n_rows = max(layer.values(), default=-1) + 1
    rows: list[list[int]] = [[] for _ in range(lay.n_rows)]
    for v in list(range(n_nodes, n_all)) + list(range(n_nodes)):
        rows[layer[v]].append(v)
    for chain in lay.chains:
        for v in chain[1:-1]:
            rows[layer[v]].append(v)
    rows = _order(rows, up, down)
    x = _place_x(rows, width, up, down)
    shift = margin - min((x[v] - width[v] / 2 for v in x), default=0)
    lay.x = {v: c + shift for v, c in x.items()}
    lay.y = {v: top + layer[v] * (box_h + row_gap) for v in lay.x}
    return lay


def entries(lay: Layout) -> dict[int, float]:
    """Where each edge (by id of its chain) enters its target box: its own spot along the
    top, in the order of the sources' x."""
    entry: dict[int, float] = {}
    into: dict[int, list[list[int]]] = {}
    for c in lay.chains:
        into.setdefault(c[-1], []).append(c)
    for d, ins in into.items():
        ins.sort(key=lambda c: lay.x[c[-2]])
        k = len(ins)
        step = min(14.0, (lay.width[d] - 16) / max(k, 1))
        for j, c in enumerate(ins):
            entry[id(c)] = lay.x[d] + (j - (k - 1) / 2) * step
    return entry


__all__ = ["Edge", "Layout", "copy_sources", "entries", "layers", "place"]
