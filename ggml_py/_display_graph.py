"""The graph picture and the scheduler's splits, for :mod:`ggml_py._display`.

A layered drawing: each node one row below its lowest operand, each input right above its
first consumer; an edge that skips rows passes through a narrow placeholder in each row it
crosses, so every edge runs between rows or beside boxes, never through one. Rows are ordered
by the barycenters of their neighbours and boxes pulled toward them. With a scheduler that
placed the graph, boxes take the colour of the backend they ran on; the copies the scheduler
made (named ``<backend>#<source>#<n>`` by ggml) are drawn dashed, linked to their source. On a
meta device each box shows where its tensor lives, in the devices' colours: a tensor split on
its last axis (numpy's columns) in vertical stripes, split on another axis in horizontal bands,
each as wide as that device's slice; a partial sum in equal stripes with a dotted border (each
device holds a share of a sum); a mirrored one (every device holds all of it) in grey.
"""
from __future__ import annotations

import html
import itertools
from typing import Any, Callable, TypeVar

from ._loader import ffi, lib
from .errors import GGMLError

DRAW_LIMIT = 600         # graphs with more tensors are described, not drawn
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#edc948",
           "#9c755f", "#ff9da7", "#bab0ac"]
FILLS = ["#dce6f2", "#fde5cc", "#dcefd8", "#f9d9da", "#e0f1ef", "#ece0ea", "#fbf3d0",
         "#ebe2dc", "#ffe9ed", "#eeebea"]
MIRRORED_FILL = "#ececec"   # a meta device's mirrored tensors: every device holds all of it
VIEW_OPS = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
_ids = itertools.count()
_T = TypeVar("_T")
Edge = tuple[int, int]


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _safe(fn: Callable[[], Any], default: Any = None) -> Any:
    """fn() or `default` when the object cannot answer (closed, server gone)."""
    try:
        return fn()
    except (GGMLError, OSError, ValueError, TypeError, AttributeError):
        return default


def _addr(raw: Any) -> int:
    return int(ffi.cast("uintptr_t", raw))


def _sources(t: Any, by_addr: dict[int, Any]) -> list[Any]:
    """The operands of `t` among the tensors in `by_addr` (address -> Tensor), read from
    the raw tensor: after a scheduler split the graph, some operands are its own copies,
    which only the graph's walk knows."""
    return [by_addr[_addr(s)] for s in t.ptr.src if s != ffi.NULL and _addr(s) in by_addr]


def _label(t: Any, is_node: bool) -> list[str]:
    shape = "\u00d7".join(str(s) for s in t.shape)
    typed = f"{t.type.name} [{shape}]"
    if is_node:
        name = t.name       # ggml names unnamed nodes node_<i>: not worth a line
        auto = name.startswith("node_") and name[5:].isdigit()
        return [t.op, name, typed] if name and not auto else [t.op, typed]
    return [t.name or "input", typed]


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "\u2026"


def _backend_labels(scheduler: Any) -> dict[str, str]:
    """backend name -> a short label: the device's name (RPC backends are named after
    their server's address), numbered when two backends share a device."""
    labels: dict[str, str] = {}
    seen: dict[str, int] = {}
    for b in scheduler.backends:
        dev = _safe(lambda: b.device.name) or b.name
        seen[dev] = seen.get(dev, 0) + 1
        labels[b.name] = dev if seen[dev] == 1 else f"{dev}#{seen[dev] - 1}"
        # ggml names its copies after its own backend name, which can differ from ggml_py's
        # (ggml calls every RPC backend "RPC0[host:port]")
        raw = _safe(lambda: ffi.string(lib.ggml_backend_name(b.ptr)).decode())
        if raw and raw not in labels:
            labels[raw] = labels[b.name]
    return labels


def _copy_of(t: Any, labels: dict[str, str]) -> tuple[str, str] | None:
    """(backend label, source name) when `t` is a copy ggml's scheduler made: it names them
    ``<backend>#<source>#<n>`` and points the nodes of a split at them."""
    name: str = t.name
    for bname, label in labels.items():
        if name.startswith(bname + "#"):
            src, _, n = name[len(bname) + 1:].rpartition("#")
            if n.isdigit():
                return label, src
    return None


def _placement(graph: Any, scheduler: Any
               ) -> tuple[dict[Any, str], list[str], dict[Any, str]]:
    """({tensor: backend label} as the scheduler placed them, [labels], {copy: source name});
    empty when no scheduler placed the graph."""
    if scheduler is None:
        scheduler = getattr(graph, "scheduler", None)
    if scheduler is not None and _last_graph(scheduler) is not None \
            and _last_graph(scheduler) is not graph:
        return {}, [], {}     # that scheduler has placed another graph since
    if scheduler is None or _safe(lambda: scheduler.closed, True):
        return {}, [], {}
    labels = _backend_labels(scheduler)
    placed: dict[Any, str] = {}
    copies: dict[Any, str] = {}
    for t in graph.nodes + graph.leafs:
        copy = _copy_of(t, labels)
        if copy is not None:
            placed[t], copies[t] = copy
            continue
        b = _safe(lambda: scheduler.backend_of(t))
        if b is not None:
            placed[t] = labels.get(b.name, b.name)
    return placed, (list(dict.fromkeys(labels.values())) if placed else []), copies


def _meta_placement(graph: Any) -> tuple[list[str], dict[Any, tuple[str, list[int], str]]]:
    """([part names], {tensor: (kind, elements per part, state name)}) for a graph over a
    meta device (kind: "columns" or "rows" for a split on ggml axis 0 or another one,
    "partial" or "mirrored"); empty for other graphs and for
    graphs the meta backend refuses (the picture then shows no placement)."""
    from . import _meta_plan, _split
    tensors = graph.nodes + graph.leafs
    dev = next((m for m in (_safe(lambda: _meta_plan.meta_of_tensor(t)) for t in graph.outputs)
                if m is not None), None)
    if dev is None:
        return [], {}
    planner = _meta_plan._Planner(dev.n_parts)
    out: dict[Any, tuple[str, list[int], str]] = {}
    for t in tensors:
        st = _safe(lambda: planner.state(t.ptr, False))
        if st is None or st.axis == _split.UNKNOWN:
            return [], {}
        if st.split:
            out[t] = ("columns" if st.axis == 0 else "rows", st.per_device(dev.n_parts),
                      f"split {st.name(t.ndim)}")
        elif st.axis == _split.PARTIAL:
            out[t] = ("partial", [1] * dev.n_parts, "partial sums")
        else:
            out[t] = ("mirrored", [1] * dev.n_parts, "mirrored")
    return [d.name for d in dev.parts], out


def _layers(n_nodes: int, n_all: int, edges: list[Edge], copied: dict[int, str]
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


def _copy_sources(copies: dict[int, str], placed: dict[int, str], names: list[str]
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


def graph_svg(graph: Any, scheduler: Any = None) -> str:
    """The graph as an SVG picture: inputs above the ops that use them, arrows from sources
    to results, edges routed between the rows of boxes (never through one), output boxes
    drawn bold. With a scheduler that placed the graph (`scheduler`, or ``graph.scheduler``),
    each box is coloured by the backend it runs on, with a legend."""
    try:
        return _graph_svg(graph, scheduler)
    except GGMLError as e:     # a context of the graph was closed
        return _svg_message(f"graph unavailable: {e}")


def _graph_svg(graph: Any, scheduler: Any) -> str:
    nodes, leafs = graph.nodes, graph.leafs
    if len(nodes) + len(leafs) > DRAW_LIMIT:
        return _svg_message(f"a graph of {len(nodes)} nodes and {len(leafs)} inputs: too large "
                            f"to draw (limit {DRAW_LIMIT}); Graph.to_dot() gives Graphviz text")
    # vertices are ints: nodes 0..n-1 in ggml's order, then leafs, then edge placeholders
    tensors = nodes + leafs
    n_nodes, n_all = len(nodes), len(tensors)
    vid = {_addr(t.ptr): v for v, t in enumerate(tensors)}
    is_node = [v < n_nodes for v in range(n_all)]
    edges = [(vid[_addr(s)], v) for v, n in enumerate(nodes) for s in n.ptr.src
             if s != ffi.NULL and _addr(s) in vid]
    outputs = {vid.get(_addr(o.ptr)) for o in getattr(graph, "outputs", [])}
    by_tensor, backends, copies_t = _placement(graph, scheduler)
    parts, meta_t = ([], {}) if by_tensor else _meta_placement(graph)
    meta = {v: meta_t[t] for v, t in enumerate(tensors) if t in meta_t}
    if meta:
        backends = parts
    placed = {v: by_tensor[t] for v, t in enumerate(tensors) if t in by_tensor}
    copies = {v: copies_t[t] for v, t in enumerate(tensors) if t in copies_t}
    color = {b: i % len(PALETTE) for i, b in enumerate(backends)}

    labels = [_label(t, is_node[v]) for v, t in enumerate(tensors)]
    for v, (_, _, state) in meta.items():
        labels[v].append(state)
    copy_src = _copy_sources(copies, placed, [t.name for t in tensors])
    copy_edges = {(src, c) for c, src in copy_src.items()}
    edges += sorted(copy_edges, key=lambda e: labels[e[1]])
    layer = _layers(n_nodes, n_all, edges, copies)
    for v, src in copies.items():
        labels[v] = [f"copy of {src}", f"to {placed[v]}", labels[v][-1]]
    char_w, row_gap = 6.8, 36
    box_h = 46 if max((len(lb) for lb in labels), default=0) <= 3 else 58
    width = {v: min(220, max(92, 14 + char_w * max(len(s) for s in labels[v])))
             for v in range(n_all)}

    # long edges pass through one small placeholder per row they cross
    up: dict[int, list[int]] = {}
    down: dict[int, list[int]] = {}
    chains: list[list[int]] = []
    dummies = itertools.count(n_all)
    for s, d in edges:
        chain = [s]
        for r in range(layer[s] + 1, layer[d]):
            v = next(dummies)
            layer[v], width[v] = r, 8
            chain.append(v)
        chain.append(d)
        chains.append(chain)
        for upper, lower in zip(chain, chain[1:]):
            up.setdefault(lower, []).append(upper)
            down.setdefault(upper, []).append(lower)
    n_rows = max(layer.values(), default=-1) + 1
    rows: list[list[int]] = [[] for _ in range(n_rows)]
    for v in list(range(n_nodes, n_all)) + list(range(n_nodes)):
        rows[layer[v]].append(v)
    for chain in chains:
        for v in chain[1:-1]:
            rows[layer[v]].append(v)
    rows = _order(rows, up, down)
    x = _place_x(rows, width, up, down)
    margin = 14
    shift = margin - min((x[v] - width[v] / 2 for v in x), default=0)
    x = {v: c + shift for v, c in x.items()}
    legend_h = 22 if backends else 0
    top = margin + legend_h
    y = {v: top + layer[v] * (box_h + row_gap) for v in x}
    total_w = max([x[v] + width[v] / 2 for v in x] + [260, 130 * len(backends) + 150 * bool(meta)]) \
        + margin
    total_h = top + n_rows * (box_h + row_gap) - row_gap + margin

    mid = f"arrow{next(_ids)}"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" height="{total_h:.0f}" '
           f'viewBox="0 0 {total_w:.0f} {total_h:.0f}" font-family="monospace" font-size="11">',
           f'<defs><marker id="{mid}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           f'fill="#555"/></marker></defs>',
           '<rect width="100%" height="100%" fill="white"/>']
    for i, name in enumerate(backends):
        lx = margin + i * 130
        out.append(f'<rect x="{lx}" y="{margin - 6}" width="14" height="12" rx="2" '
                   f'fill="{FILLS[color[name]]}" stroke="{PALETTE[color[name]]}" stroke-width="2"/>'
                   f'<text x="{lx + 20}" y="{margin + 4}">{_e(_clip(name, 15))}</text>')
    if meta:
        lx = margin + len(backends) * 130
        out.append(f'<rect x="{lx}" y="{margin - 6}" width="14" height="12" rx="2" '
                   f'fill="{MIRRORED_FILL}" stroke="#888" stroke-width="1"/>'
                   f'<text x="{lx + 20}" y="{margin + 4}">mirrored (on each)</text>')

    # edges: enter each box at its own spot along the top, in the order of the sources' x
    entry: dict[int, float] = {}
    into: dict[int, list[list[int]]] = {}
    for c in chains:
        into.setdefault(c[-1], []).append(c)
    for d, ins in into.items():
        ins.sort(key=lambda c: x[c[-2]])
        k = len(ins)
        step = min(14.0, (width[d] - 16) / max(k, 1))
        for j, c in enumerate(ins):
            entry[id(c)] = x[d] + (j - (k - 1) / 2) * step
    for chain in chains:
        pts = [(x[chain[0]], y[chain[0]] + box_h)]
        for v in chain[1:-1]:
            pts += [(x[v], y[v]), (x[v], y[v] + box_h)]
        pts.append((entry[id(chain)], y[chain[-1]]))
        path = [f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"]
        for i in range(1, len(pts)):
            (x0, y0), (x1, y1) = pts[i - 1], pts[i]
            if i % 2 == 1:        # between rows: a curve with vertical ends
                ym = (y0 + y1) / 2
                path.append(f"C{x0:.1f},{ym:.1f} {x1:.1f},{ym:.1f} {x1:.1f},{y1:.1f}")
            else:                 # straight down through a row, beside its boxes
                path.append(f"L{x1:.1f},{y1:.1f}")
        style = 'stroke="#666" stroke-width="1.2"'
        if (chain[0], chain[-1]) in copy_edges:      # a copy between backends
            style = (f'stroke="{PALETTE[color[placed[chain[-1]]]]}" stroke-width="1.6" '
                     'stroke-dasharray="5 3"')
        out.append(f'<path d="{" ".join(path)}" fill="none" {style} marker-end="url(#{mid})"/>')

    for t in range(n_all):
        where = placed.get(t)
        if where is not None:
            fill, stroke = FILLS[color[where]], PALETTE[color[where]]
        else:
            fill, stroke = ("#dbe9ff", "#446") if is_node[t] else ("#e8f5d8", "#464")
        bold = t in outputs
        left = x[t] - width[t] / 2
        tip = f"{' / '.join(labels[t])}" + (f" on {where}" if where else "")
        dash = ' stroke-dasharray="4 3"' if t in copies else ""
        rx = 4 if is_node[t] else 12
        out.append(f'<g><title>{_e(tip)}</title>')
        if t in meta:
            fill = "none"
            kind, shares, _ = meta[t]
            out.append(_stripes(left, y[t], width[t], box_h, rx, kind, shares))
            if kind == "partial":
                dash = ' stroke-dasharray="2 2"'
        out.append(f'<rect x="{left:.1f}" y="{y[t]:.1f}" '
                   f'width="{width[t]:.1f}" height="{box_h}" rx="{rx}" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="{3 if bold else 1.2}"{dash}/>')
        lines = labels[t]
        n_chars = int((width[t] - 10) / char_w)
        y0 = y[t] + {1: 27, 2: 20, 3: 15}.get(len(lines), 14)
        for i, line in enumerate(lines):
            weight = ' font-weight="bold"' if i == 0 else ' fill="#444"'
            out.append(f'<text x="{x[t]:.1f}" y="{y0 + i * 13:.1f}" text-anchor="middle"'
                       f'{weight}>{_e(_clip(line, n_chars))}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _stripes(left: float, top: float, w: float, h: float, rx: int, kind: str,
             shares: list[int]) -> str:
    """The inside of a meta tensor's box, clipped to it: a stripe (columns, partial) or a
    band (rows) per device holding part of the tensor, as wide as its share, in its device's
    colour (the legend's); a mirrored tensor in grey."""
    cid = f"clip{next(_ids)}"
    out = [f'<clipPath id="{cid}"><rect x="{left:.1f}" y="{top:.1f}" width="{w:.1f}" '
           f'height="{h}" rx="{rx}"/></clipPath><g clip-path="url(#{cid})">']
    if kind == "mirrored":
        out.append(f'<rect class="mirrored" x="{left:.1f}" y="{top:.1f}" width="{w:.1f}" '
                   f'height="{h}" fill="{MIRRORED_FILL}"/>')
    total, pos = sum(shares), 0.0
    for j, share in enumerate(shares if kind != "mirrored" and total else ()):
        colour = FILLS[j % len(FILLS)]
        if kind == "rows":
            bh = h * share / total
            out.append(f'<rect class="part{j}" x="{left:.1f}" y="{top + pos:.1f}" '
                       f'width="{w:.1f}" height="{bh:.1f}" fill="{colour}"/>')
            pos += bh
        else:
            sw = w * share / total
            out.append(f'<rect class="part{j}" x="{left + pos:.1f}" y="{top:.1f}" '
                       f'width="{sw:.1f}" height="{h}" fill="{colour}"/>')
            pos += sw
    out.append("</g>")
    return "".join(out)


def _svg_message(text: str) -> str:
    w = max(200, 7 * len(text) + 20)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="30" '
            f'font-family="monospace" font-size="11"><text x="10" y="19">{_e(text)}</text></svg>')


# -- scheduler -------------------------------------------------------------------------------

def splits(sched: Any, graph: Any) -> list[dict[str, Any]]:
    """The graph's nodes grouped as the scheduler runs them, following ggml's rules: a split
    is a run of consecutive nodes on one backend (view ops go with the run they sit in),
    and a new split starts where a node needs a weight copied from another backend after
    the run already took inputs. Each item is a dict with ``backend`` (the device's name),
    ``nodes``, ``ops`` and ``inputs`` (names of the tensors copied in)."""
    labels = _backend_labels(sched)
    nodes = graph.nodes
    node_ops = {n.name: n.op for n in nodes}
    by_addr = {_addr(t.ptr): t for t in nodes + graph.leafs}
    out, current = [], None
    for n in nodes:
        b = _safe(lambda: sched.backend_of(n))
        if b is None or (n.op in VIEW_OPS and current is not None):
            if current is not None:
                current["nodes"].append(n)
            continue
        label = labels.get(b.name, b.name)
        ins = []
        for s in _sources(n, by_addr):
            copy = _copy_of(s, labels)
            if copy is not None:     # (name, whether a leaf: a weight or an input)
                name = copy[1]
                if name.startswith("node_") and name in node_ops:   # ggml's automatic name
                    name = f"{name} ({node_ops[name]})"
                ins.append((name, copy[1] not in node_ops))
            else:
                sb = _safe(lambda: sched.backend_of(s))
                if sb is not None and labels.get(sb.name, sb.name) != label:
                    ins.append((s.name or s.op, s.op == "NONE"))
        new_weight = any(leaf and name not in current["inputs"] for name, leaf in ins) \
            if current is not None else False
        if current is None or current["backend"] != label or (new_weight and current["inputs"]):
            current = {"backend": label, "nodes": [], "ops": [], "inputs": []}
            out.append(current)
        current["nodes"].append(n)
        current["ops"].append(n.op)
        for name, _ in ins:
            if name not in current["inputs"]:
                current["inputs"].append(name)
    return out


def _last_graph(sched: Any) -> Any:
    """The graph the scheduler placed last (``Scheduler.graph``), None before any."""
    return getattr(sched, "graph", None)
