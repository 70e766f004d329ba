"""The graph picture and the scheduler's splits, for :mod:`ggml_py._display`.

A layered drawing (laid out by :mod:`ggml_py._display_layout`): each node one row below its
lowest operand, each input right above its first consumer, edges between rows or beside
boxes, never through one. With a scheduler that
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
from dataclasses import dataclass, field
from typing import Any, Callable

from ._display_layout import Edge, Layout, copy_sources, entries, layers, place
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
_CHAR_W, _ROW_GAP, _MARGIN = 6.8, 36, 14      # a character's width, room between rows


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


def graph_svg(graph: Any, scheduler: Any = None) -> str:
    """The graph as an SVG picture: inputs above the ops that use them, arrows from sources
    to results, edges routed between the rows of boxes (never through one), output boxes
    drawn bold. With a scheduler that placed the graph (`scheduler`, or ``graph.scheduler``),
    each box is coloured by the backend it runs on, with a legend."""
    try:
        return _graph_svg(graph, scheduler)
    except GGMLError as e:     # a context of the graph was closed
        return _svg_message(f"graph unavailable: {e}")


@dataclass
class _Picture:
    """What the picture shows, by vertex (nodes 0..n-1 in ggml's order, then leafs)."""

    tensors: list[Any]
    n_nodes: int
    edges: list[Edge]                  # (source, destination)
    outputs: set[int | None]
    backends: list[str]                # legend entries: backends, or a meta device's parts
    placed: dict[int, str]             # vertex -> backend label
    copies: dict[int, str]             # a scheduler's copy -> its source's name
    meta: dict[int, tuple[str, list[int], str]]
    labels: list[list[str]]
    copy_edges: set[Edge] = field(default_factory=set)

    @property
    def color(self) -> dict[str, int]:
        return {b: i % len(PALETTE) for i, b in enumerate(self.backends)}


def _picture(graph: Any, scheduler: Any, nodes: list[Any], leafs: list[Any]) -> _Picture:
    """The vertices, edges, placement and labels of `graph`'s picture."""
    tensors = nodes + leafs
    n_nodes = len(nodes)
    vid = {_addr(t.ptr): v for v, t in enumerate(tensors)}
    edges = [(vid[_addr(s)], v) for v, n in enumerate(nodes) for s in n.ptr.src
             if s != ffi.NULL and _addr(s) in vid]
    outputs = {vid.get(_addr(o.ptr)) for o in getattr(graph, "outputs", [])}
    by_tensor, backends, copies_t = _placement(graph, scheduler)
    parts, meta_t = ([], {}) if by_tensor else _meta_placement(graph)
    meta = {v: meta_t[t] for v, t in enumerate(tensors) if t in meta_t}
    if meta:
        backends = parts
    pic = _Picture(tensors, n_nodes, edges, outputs, backends,
                   placed={v: by_tensor[t] for v, t in enumerate(tensors) if t in by_tensor},
                   copies={v: copies_t[t] for v, t in enumerate(tensors) if t in copies_t},
                   meta=meta, labels=[_label(t, v < n_nodes) for v, t in enumerate(tensors)])
    for v, (_, _, state) in meta.items():
        pic.labels[v].append(state)
    copy_src = copy_sources(pic.copies, pic.placed, [t.name for t in tensors])
    pic.copy_edges = {(src, c) for c, src in copy_src.items()}
    pic.edges += sorted(pic.copy_edges, key=lambda e: pic.labels[e[1]])
    return pic


def _graph_svg(graph: Any, scheduler: Any) -> str:
    nodes, leafs = graph.nodes, graph.leafs
    if len(nodes) + len(leafs) > DRAW_LIMIT:
        return _svg_message(f"a graph of {len(nodes)} nodes and {len(leafs)} inputs: too large "
                            f"to draw (limit {DRAW_LIMIT}); Graph.to_dot() gives Graphviz text")
    pic = _picture(graph, scheduler, nodes, leafs)
    n_all = len(pic.tensors)
    layer = layers(pic.n_nodes, n_all, pic.edges, pic.copies)
    labels = pic.labels
    for v, src in pic.copies.items():
        labels[v] = [f"copy of {src}", f"to {pic.placed[v]}", labels[v][-1]]
    box_h = 46 if max((len(lb) for lb in labels), default=0) <= 3 else 58
    width = {v: min(220, max(92, 14 + _CHAR_W * max(len(s) for s in labels[v])))
             for v in range(n_all)}
    top = _MARGIN + (22 if pic.backends else 0)      # (room for the legend)
    lay = place(pic.n_nodes, n_all, pic.edges, layer, width, box_h=box_h, row_gap=_ROW_GAP,
                margin=_MARGIN, top=top)
    total_w = max([lay.x[v] + width[v] / 2 for v in lay.x]
                  + [260, 130 * len(pic.backends) + 150 * bool(pic.meta)]) + _MARGIN
    total_h = top + lay.n_rows * (box_h + _ROW_GAP) - _ROW_GAP + _MARGIN
    mid = f"arrow{next(_ids)}"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" height="{total_h:.0f}" '
           f'viewBox="0 0 {total_w:.0f} {total_h:.0f}" font-family="monospace" font-size="11">',
           f'<defs><marker id="{mid}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           f'fill="#555"/></marker></defs>',
           '<rect width="100%" height="100%" fill="white"/>']
    out += _legend(pic)
    out += _edge_paths(pic, lay, box_h, mid)
    for v in range(n_all):
        out += _box(pic, lay, v, box_h)
    out.append("</svg>")
    return "\n".join(out)


def _legend(pic: _Picture) -> list[str]:
    """A swatch per backend (or meta device part), and one for mirrored tensors."""
    out = []
    color = pic.color
    for i, name in enumerate(pic.backends):
        lx = _MARGIN + i * 130
        out.append(f'<rect x="{lx}" y="{_MARGIN - 6}" width="14" height="12" rx="2" '
                   f'fill="{FILLS[color[name]]}" stroke="{PALETTE[color[name]]}" stroke-width="2"/>'
                   f'<text x="{lx + 20}" y="{_MARGIN + 4}">{_e(_clip(name, 15))}</text>')
    if pic.meta:
        lx = _MARGIN + len(pic.backends) * 130
        out.append(f'<rect x="{lx}" y="{_MARGIN - 6}" width="14" height="12" rx="2" '
                   f'fill="{MIRRORED_FILL}" stroke="#888" stroke-width="1"/>'
                   f'<text x="{lx + 20}" y="{_MARGIN + 4}">mirrored (on each)</text>')
    return out


def _edge_paths(pic: _Picture, lay: Layout, box_h: float, mid: str) -> list[str]:
    """Each edge as a path: curves between rows, straight down beside the boxes of a row it
    crosses; a scheduler's copies dashed in the colour of the backend they copy to."""
    out = []
    x, y, color = lay.x, lay.y, pic.color
    entry = entries(lay)
    for chain in lay.chains:
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
        if (chain[0], chain[-1]) in pic.copy_edges:      # a copy between backends
            style = (f'stroke="{PALETTE[color[pic.placed[chain[-1]]]]}" stroke-width="1.6" '
                     'stroke-dasharray="5 3"')
        out.append(f'<path d="{" ".join(path)}" fill="none" {style} marker-end="url(#{mid})"/>')
    return out


def _box(pic: _Picture, lay: Layout, t: int, box_h: float) -> list[str]:
    """The box of vertex `t` with its tooltip and label lines: coloured by its backend,
    striped by its meta placement, bold for an output, dashed for a copy."""
    x, y, width = lay.x, lay.y, lay.width
    is_node = t < pic.n_nodes
    where = pic.placed.get(t)
    if where is not None:
        fill, stroke = FILLS[pic.color[where]], PALETTE[pic.color[where]]
    else:
        fill, stroke = ("#dbe9ff", "#446") if is_node else ("#e8f5d8", "#464")
    bold = t in pic.outputs
    left = x[t] - width[t] / 2
    tip = f"{' / '.join(pic.labels[t])}" + (f" on {where}" if where else "")
    dash = ' stroke-dasharray="4 3"' if t in pic.copies else ""
    rx = 4 if is_node else 12
    out = [f'<g><title>{_e(tip)}</title>']
    if t in pic.meta:
        fill = "none"
        kind, shares, _ = pic.meta[t]
        out.append(_stripes(left, y[t], width[t], box_h, rx, kind, shares))
        if kind == "partial":
            dash = ' stroke-dasharray="2 2"'
    out.append(f'<rect x="{left:.1f}" y="{y[t]:.1f}" '
               f'width="{width[t]:.1f}" height="{box_h}" rx="{rx}" '
               f'fill="{fill}" stroke="{stroke}" stroke-width="{3 if bold else 1.2}"{dash}/>')
    lines = pic.labels[t]
    n_chars = int((width[t] - 10) / _CHAR_W)
    y0 = y[t] + {1: 27, 2: 20, 3: 15}.get(len(lines), 14)
    for i, line in enumerate(lines):
        weight = ' font-weight="bold"' if i == 0 else ' fill="#444"'
        out.append(f'<text x="{x[t]:.1f}" y="{y0 + i * 13:.1f}" text-anchor="middle"'
                   f'{weight}>{_e(_clip(line, n_chars))}</text>')
    out.append("</g>")
    return out


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
