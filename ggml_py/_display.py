"""Rich and plain displays of ggml_py objects, for Jupyter and the terminal.

Pure functions over the objects' public attributes; the classes call them lazily from
``_repr_html_``, ``__repr__`` and ``to_svg``. A display never raises: a closed object, a
tensor without memory or a server that went away is said in words instead.

    >>> from ggml_py._display import tensor_repr       # doctest: +SKIP
    >>> print(tensor_repr(t))
    <Tensor 'x' f32 (2, 3) on CPU>
    [[0. 1. 2.]
     [3. 4. 5.]]
"""
from __future__ import annotations

import html
import itertools

import numpy as np

from ._loader import ffi
from .errors import GGMLError

FETCH_LIMIT = 8 << 20    # bytes of a device tensor fetched to show its values
DRAW_LIMIT = 600         # graphs with more tensors are described, not drawn
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#edc948",
           "#9c755f", "#ff9da7", "#bab0ac"]
FILLS = ["#dce6f2", "#fde5cc", "#dcefd8", "#f9d9da", "#e0f1ef", "#ece0ea", "#fbf3d0",
         "#ebe2dc", "#ffe9ed", "#eeebea"]
VIEW_OPS = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}

_BOX = "font-family:monospace;font-size:12px;border-collapse:collapse"
_TD = "padding:2px 8px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top"
_ids = itertools.count()


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _safe(fn, default=None):
    """fn() or `default` when the object cannot answer (closed, server gone)."""
    try:
        return fn()
    except (GGMLError, OSError, ValueError, TypeError, AttributeError):
        return default


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _max_size(n: int) -> str:
    return "no limit" if n >= (1 << 62) else _size(n)     # ggml says SIZE_MAX for none


def _table(rows, header=None) -> str:
    out = [f'<table style="{_BOX}">']
    if header:
        out.append("<tr>" + "".join(f'<th style="{_TD};border-bottom:2px solid #999">{_e(h)}</th>'
                                    for h in header) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f'<td style="{_TD}">{c}</td>' for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _badge(text: str, on: bool) -> str:
    color, bg = ("#1b5e20", "#dcefd8") if on else ("#888", "#f1f1f1")
    mark = "&#10003;" if on else "&#10007;"
    return (f'<span style="display:inline-block;margin:1px 3px 1px 0;padding:0 6px;'
            f'border-radius:8px;background:{bg};color:{color};font-size:11px">'
            f'{mark} {_e(text)}</span>')


def _title(kind: str, name: str, extra: str = "") -> str:
    return (f'<div style="font-family:sans-serif;margin-bottom:4px"><b>{_e(kind)}</b> '
            f'<code>{_e(name)}</code> <span style="color:#666">{extra}</span></div>')


# -- devices ---------------------------------------------------------------------------------

def _memory_bar(mem, width: int = 160) -> str:
    if not mem or not mem[1]:
        return '<span style="color:#888">memory not reported</span>'
    free, total = mem
    used = max(0.0, min(1.0, 1 - free / total))
    return (f'<span title="{_e(_size(total - free))} used of {_e(_size(total))}" '
            f'style="display:inline-block;vertical-align:middle;width:{width}px;height:10px;'
            f'background:#e6e6e6;border-radius:3px;overflow:hidden">'
            f'<span style="display:block;height:10px;width:{used * 100:.1f}%;background:#4e79a7">'
            f'</span></span> <span style="font-family:monospace;font-size:11px">'
            f'{_e(_size(free))} free of {_e(_size(total))}</span>')


def _caps(dev) -> str:
    caps = _safe(lambda: dev.caps)
    if caps is None:
        return '<span style="color:#888">unknown</span>'
    return "".join(_badge(k.rstrip("_"), bool(v)) for k, v in caps._asdict().items())


def device_repr(dev) -> str:
    """One line: name, type, description, free memory, the capabilities that are on."""
    name = _safe(lambda: dev.name, "?")
    head = f"<Device {name} ({_safe(lambda: dev.type, '?')}) {_safe(lambda: dev.description, '')!r}"
    mem = _safe(lambda: dev.memory)
    if mem and mem[1]:
        head += f" {_size(mem[0])} free of {_size(mem[1])}"
    caps = _safe(lambda: dev.caps)
    if caps is not None:
        on = [k.rstrip("_") for k, v in caps._asdict().items() if v]
        head += f" caps: {', '.join(on) or 'none'}"
    elif name != "?":
        head += " (not reachable)"
    return head + ">"


def device_html(dev) -> str:
    """A device: name, type, description, a memory bar, caps and its buffer types."""
    name = _safe(lambda: dev.name, "?")
    desc = _safe(lambda: dev.description, "")
    bufts = _safe(lambda: dev.buffer_types, []) or []
    rows = [[f"<code>{_e(b.name)}</code>", _e(b.alignment), _e(_max_size(b.max_size)),
             "yes" if b.is_host else "no"] for b in bufts]
    parts = [_title("Device", name, f"{_e(_safe(lambda: dev.type, '?'))} &middot; {_e(desc)}"),
             _table([["memory", _memory_bar(_safe(lambda: dev.memory))], ["caps", _caps(dev)]]),
             '<div style="font-family:sans-serif;margin:6px 0 2px">buffer types</div>',
             _table(rows, ["name", "alignment", "max size", "host-readable"]) if rows else
             '<span style="color:#888">none reported</span>']
    return "<div>" + "".join(parts) + "</div>"


def devices_html(devices=None) -> str:
    """A table of devices (every device of ``gg.devices()`` when `devices` is None)."""
    if devices is None:
        from . import devices as all_devices
        devices = all_devices()
    rows = []
    for d in devices:
        rows.append([f"<code><b>{_e(_safe(lambda: d.name, '?'))}</b></code>",
                     _e(_safe(lambda: d.type, "?")), _e(_safe(lambda: d.description, "")),
                     _memory_bar(_safe(lambda: d.memory), 110), _caps(d)])
    return "<div>" + _title("Devices", "", f"{len(rows)}") + _table(
        rows, ["name", "type", "description", "memory", "caps"]) + "</div>"


# -- buffers ---------------------------------------------------------------------------------

def buffer_html(buf) -> str:
    """A buffer: name, size, usage, host or device memory, its buffer type and device."""
    if _safe(lambda: buf.closed, True):
        return _title("Buffer", "", "closed")
    buft = _safe(lambda: buf.buffer_type)
    dev = _safe(lambda: buft.device) if buft is not None else None
    rows = [["size", _e(f"{_size(_safe(lambda: buf.size))} ({_safe(lambda: buf.size)} bytes)")],
            ["host-readable", "yes" if _safe(lambda: buf.is_host) else "no"],
            ["usage", _e(_safe(lambda: buf.usage, "?"))],
            ["buffer type", f"<code>{_e(_safe(lambda: buft.name, '?'))}</code>"],
            ["device", _e(_safe(lambda: dev.name, "?")) if dev is not None else "\u2014"],
            ["base", f"<code>{_safe(lambda: buf.base, 0):#x}</code>"]]
    return "<div>" + _title("Buffer", _safe(lambda: buf.name, "?")) + _table(rows) + "</div>"


# -- tensors ---------------------------------------------------------------------------------

def _where(t) -> str | None:
    buf = _safe(lambda: t.buffer)
    if buf is None:
        return None
    return _safe(lambda: buf.buffer_type.name) or _safe(lambda: buf.name) or "?"


def _values(t) -> tuple[np.ndarray | None, str]:
    """(values, why not) for a tensor: plain host memory is read in place (a view: printing
    reads only the elements shown), device memory fetched and quantized data dequantized
    when small enough."""
    if t.data is None:
        return None, "no memory yet: allocate its context (ctx.alloc(backend)) or compute its graph"
    try:
        if t.is_host and t.dtype is not None:
            return t.numpy(), ""
        if t.nbytes > FETCH_LIMIT:
            where, what = ("in host memory", "dequantized") if t.is_host else \
                ("on the device", "fetched")
            return None, (f"{_size(t.nbytes)} of {t.type.name} {where}: not {what} for "
                          "display (t.numpy() does it)")
        if not t.is_contiguous:
            return None, "a non-contiguous view of device memory (compute gg.cont(t) to see it)"
        return t.numpy(copy=True), ""
    except GGMLError as e:
        return None, f"values unavailable: {e}"


def _preview(a: np.ndarray) -> str:
    with np.printoptions(threshold=120, edgeitems=3, precision=4, linewidth=88):
        return np.array2string(a, separator=" ")


def _strides(t) -> tuple[int, ...]:
    return tuple(reversed(t.nb[: t.ndim]))


def tensor_repr(t) -> str:
    """``<Tensor 'x' f32 (2, 3) on CPU>`` and, for host memory, the values as numpy prints them."""
    try:
        name = t.name
        head = f"<Tensor {name!r} " if name else "<Tensor "
        head += f"{t.type.name} {t.shape}"
        if t.op != "NONE":
            head += f" op={t.op}"
        where = _where(t)
        head += f" on {where}>" if where else " (no memory)>"
        if where is None or not t.is_host:
            return head
        values, why = _values(t)
        return head if values is None else head + "\n" + _preview(values)
    except GGMLError:
        return "<Tensor (context closed)>"


def tensor_html(t) -> str:
    """A tensor: shape, type, where it lives, strides, and a preview of its values (read in
    place from host memory, fetched from a device when small)."""
    try:
        name, ttype, shape, op = t.name, t.type, t.shape, t.op
    except GGMLError:
        return _title("Tensor", "", "its context is closed: the tensor is gone")
    where = _where(t)
    srcs = _safe(lambda: t.src, []) or []
    rows = [["shape", f"<code>{_e(shape)}</code> &nbsp;<span style='color:#888'>ggml ne "
                      f"{_e(tuple(t.ne))}</span>"],
            ["type", f"<code>{_e(ttype.name)}</code>"
                      + (" (quantized)" if ttype.is_quantized else "")],
            ["memory", _e(f"{where}, {'host' if t.is_host else 'device'}") if where else
             "<i>none yet</i>"],
            ["strides", f"<code>{_e(_strides(t))}</code> bytes"
                        + ("" if t.is_contiguous else " (not contiguous)")],
            ["size", _e(f"{t.size} elements, {_size(t.nbytes)}")]]
    if op != "NONE":
        names = ", ".join(_e(s.name or s.op) for s in srcs)
        rows.append(["op", f"<code>{_e(op)}</code>({names})"])
    values, why = _values(t) if where else (None, "no memory yet: allocate its context "
                                            "(ctx.alloc(backend)) or compute its graph")
    body = (f'<pre style="margin:4px 0;font-size:12px">{_e(_preview(values))}</pre>'
            if values is not None else
            f'<div style="color:#888;font-family:sans-serif">{_e(why)}</div>')
    fetched = "" if values is None or t.is_host else " &middot; values fetched from the device"
    return ("<div>" + _title("Tensor", name or "(unnamed)", fetched) + _table(rows) + body
            + "</div>")


# -- graphs ----------------------------------------------------------------------------------

def _addr(raw) -> int:
    return int(ffi.cast("uintptr_t", raw))


def _sources(t, by_addr: dict) -> list:
    """The operands of `t` among the tensors in `by_addr` (address -> Tensor), read from
    the raw tensor: after a scheduler split the graph, some operands are its own copies,
    which only the graph's walk knows."""
    return [by_addr[_addr(s)] for s in t.ptr.src if s != ffi.NULL and _addr(s) in by_addr]


def _label(t, is_node: bool) -> list[str]:
    shape = "\u00d7".join(str(s) for s in t.shape)
    typed = f"{t.type.name} [{shape}]"
    if is_node:
        name = t.name       # ggml names unnamed nodes node_<i>: not worth a line
        auto = name.startswith("node_") and name[5:].isdigit()
        return [t.op, name, typed] if name and not auto else [t.op, typed]
    return [t.name or "input", typed]


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "\u2026"


def _backend_labels(scheduler) -> dict:
    """backend name -> a short label: the device's name (RPC backends are named after
    their server's address), numbered when two backends share a device."""
    labels, seen = {}, {}
    for b in scheduler.backends:
        dev = _safe(lambda: b.device.name) or b.name
        seen[dev] = seen.get(dev, 0) + 1
        labels[b.name] = dev if seen[dev] == 1 else f"{dev}#{seen[dev] - 1}"
    return labels


def _copy_of(t, labels) -> tuple[str, str] | None:
    """(backend label, source name) when `t` is a copy ggml's scheduler made: it names them
    ``<backend>#<source>#<n>`` and points the nodes of a split at them."""
    name = t.name
    for bname, label in labels.items():
        if name.startswith(bname + "#"):
            src, _, n = name[len(bname) + 1:].rpartition("#")
            if n.isdigit():
                return label, src
    return None


def _placement(graph, scheduler):
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
    placed, copies = {}, {}
    for t in graph.nodes + graph.leafs:
        copy = _copy_of(t, labels)
        if copy is not None:
            placed[t], copies[t] = copy
            continue
        b = _safe(lambda: scheduler.backend_of(t))
        if b is not None:
            placed[t] = labels.get(b.name, b.name)
    return placed, (list(labels.values()) if placed else []), copies


def _layers(n_nodes: int, n_all: int, edges, copied) -> dict:
    """Rows of vertices 0..n_all-1 (nodes first, in ggml's dependency order, then leafs):
    nodes by longest path from the inputs (a scheduler's copy right below its source, before
    its first consumer); each other input right above its first consumer."""
    preds = {v: [] for v in range(n_all)}
    succs = {v: [] for v in range(n_all)}
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


def _copy_sources(copies, placed, names) -> dict:
    """{copy: its source} (vertex ids) where the source's name and backend tell it apart."""
    found = {}
    for c, src in copies.items():
        match = [v for v, name in enumerate(names) if v not in copies and name == src
                 and placed.get(v) not in (None, placed[c])]
        if len(match) == 1:
            found[c] = match[0]
    return found


def _order(rows, up, down, sweeps: int = 4):
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


def _place_x(rows, width, up, down, gap: float = 22.0, sweeps: int = 4):
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


def graph_svg(graph, scheduler=None) -> str:
    """The graph as an SVG picture: inputs above the ops that use them, arrows from sources
    to results, edges routed between the rows of boxes (never through one), output boxes
    drawn bold. With a scheduler that placed the graph (`scheduler`, or ``graph.scheduler``),
    each box is coloured by the backend it runs on, with a legend."""
    try:
        return _graph_svg(graph, scheduler)
    except GGMLError as e:     # a context of the graph was closed
        return _svg_message(f"graph unavailable: {e}")


def _graph_svg(graph, scheduler) -> str:
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
    placed = {v: by_tensor[t] for v, t in enumerate(tensors) if t in by_tensor}
    copies = {v: copies_t[t] for v, t in enumerate(tensors) if t in copies_t}
    color = {b: i % len(PALETTE) for i, b in enumerate(backends)}

    labels = [_label(t, is_node[v]) for v, t in enumerate(tensors)]
    copy_src = _copy_sources(copies, placed, [t.name for t in tensors])
    copy_edges = {(src, c) for c, src in copy_src.items()}
    edges += sorted(copy_edges, key=lambda e: labels[e[1]])
    layer = _layers(n_nodes, n_all, edges, copies)
    for v, src in copies.items():
        labels[v] = [f"copy of {src}", f"to {placed[v]}", labels[v][-1]]
    char_w, box_h, row_gap = 6.8, 46, 36
    width = {v: min(220, max(92, 14 + char_w * max(len(s) for s in labels[v])))
             for v in range(n_all)}

    # long edges pass through one small placeholder per row they cross
    up, down, chains = {}, {}, []
    dummies = itertools.count(n_all)
    for s, d in edges:
        chain = [s]
        for r in range(layer[s] + 1, layer[d]):
            v = next(dummies)
            layer[v], width[v] = r, 8
            chain.append(v)
        chain.append(d)
        chains.append(chain)
        for a, b in zip(chain, chain[1:]):
            up.setdefault(b, []).append(a)
            down.setdefault(a, []).append(b)
    n_rows = max(layer.values(), default=-1) + 1
    rows = [[] for _ in range(n_rows)]
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
    total_w = max([x[v] + width[v] / 2 for v in x] + [260]) + margin
    total_h = top + n_rows * (box_h + row_gap) - row_gap + margin

    mid = f"arrow{next(_ids)}"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" height="{total_h:.0f}" '
           f'viewBox="0 0 {total_w:.0f} {total_h:.0f}" font-family="monospace" font-size="11">',
           f'<defs><marker id="{mid}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           f'fill="#555"/></marker></defs>',
           f'<rect width="100%" height="100%" fill="white"/>']
    for i, b in enumerate(backends):
        lx = margin + i * 130
        out.append(f'<rect x="{lx}" y="{margin - 6}" width="14" height="12" rx="2" '
                   f'fill="{FILLS[color[b]]}" stroke="{PALETTE[color[b]]}" stroke-width="2"/>'
                   f'<text x="{lx + 20}" y="{margin + 4}">{_e(_clip(b, 15))}</text>')

    # edges: enter each box at its own spot along the top, in the order of the sources' x
    entry, into = {}, {}
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
        b = placed.get(t)
        if b is not None:
            fill, stroke = FILLS[color[b]], PALETTE[color[b]]
        else:
            fill, stroke = ("#dbe9ff", "#446") if is_node[t] else ("#e8f5d8", "#464")
        bold = t in outputs
        left = x[t] - width[t] / 2
        tip = f"{' / '.join(labels[t])}" + (f" on {b}" if b else "")
        dash = ' stroke-dasharray="4 3"' if t in copies else ""
        out.append(f'<g><title>{_e(tip)}</title><rect x="{left:.1f}" y="{y[t]:.1f}" '
                   f'width="{width[t]:.1f}" height="{box_h}" rx="{4 if is_node[t] else 12}" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="{3 if bold else 1.2}"{dash}/>')
        lines = labels[t]
        n_chars = int((width[t] - 10) / char_w)
        y0 = y[t] + (15 if len(lines) == 3 else 20)
        for i, s in enumerate(lines):
            weight = ' font-weight="bold"' if i == 0 else ' fill="#444"'
            out.append(f'<text x="{x[t]:.1f}" y="{y0 + i * 13:.1f}" text-anchor="middle"'
                       f'{weight}>{_e(_clip(s, n_chars))}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _svg_message(text: str) -> str:
    w = max(200, 7 * len(text) + 20)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="30" '
            f'font-family="monospace" font-size="11"><text x="10" y="19">{_e(text)}</text></svg>')


# -- scheduler -------------------------------------------------------------------------------

def splits(sched, graph) -> list[dict]:
    """The graph's nodes grouped as the scheduler runs them, following ggml's rules: a split
    is a run of consecutive nodes on one backend (view ops go with the run they sit in),
    and a new split starts where a node needs a weight copied from another backend after
    the run already took inputs. Each item is a dict with ``backend`` (the device's name),
    ``nodes``, ``ops`` and ``inputs`` (names of the tensors copied in)."""
    labels = _backend_labels(sched)
    nodes = graph.nodes
    node_names = {n.name for n in nodes}
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
            if copy is not None:
                ins.append((copy[1], copy[1] not in node_names))   # (name, a copied leaf)
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


def _last_graph(sched):
    """The graph the scheduler placed last: ``sched.graph`` where the class offers it, else
    the newest entry of its books of placed graphs (read only), else None."""
    graph = getattr(sched, "graph", None)
    if graph is None:
        placed = getattr(sched, "_placed", None) or []
        graph = placed[-1][0] if placed and isinstance(placed[-1], tuple) else None
    return graph


def scheduler_html(sched, graph=None) -> str:
    """A scheduler: its backends with their compute buffers, ggml's split and copy counts,
    and, for the graph it placed (`graph`, or ``sched.graph``), the splits in order and the
    graph coloured by backend."""
    if _safe(lambda: sched.closed, True):
        return _title("Scheduler", "", "closed")
    labels = _backend_labels(sched)
    names = [labels[b.name] for b in sched.backends]
    rows = [[f'<span style="color:{PALETTE[i % len(PALETTE)]}">&#9632;</span> <code>{_e(n)}</code>',
             _e(_size(_safe(lambda: sched.buffer_size(b), 0)))]
            for i, (n, b) in enumerate(zip(names, sched.backends))]
    head = _title("Scheduler", " \u2192 ".join(names),
                  f"{_safe(lambda: sched.n_splits, '?')} splits, "
                  f"{_safe(lambda: sched.n_copies, '?')} "
                  "copies (ggml's counts for the last graph)")
    parts = ["<div>", head, _table(rows, ["backend", "compute buffer"])]
    if graph is None:
        graph = _last_graph(sched)
    if graph is not None:
        found = _safe(lambda: splits(sched, graph), []) or []
        if found:
            srows = []
            for i, s in enumerate(found):
                ops = ", ".join(s["ops"][:6]) + (" \u2026" if len(s["ops"]) > 6 else "")
                ins = ", ".join(s["inputs"]) or "\u2014"
                srows.append([str(i), f"<code>{_e(s['backend'])}</code>", str(len(s["nodes"])),
                              _e(ops), _e(ins)])
            parts += ['<div style="font-family:sans-serif;margin:6px 0 2px">splits</div>',
                      _table(srows, ["#", "backend", "nodes", "ops",
                                     "inputs from another backend"])]
        parts.append(graph_svg(graph, scheduler=sched))
    parts.append("</div>")
    return "".join(parts)


# -- GGUF ------------------------------------------------------------------------------------

def _short(value, n: int = 80) -> str:
    if isinstance(value, np.ndarray):
        text = f"{value.dtype}[{value.size}]: " + np.array2string(
            value.ravel()[:8], separator=", ", threshold=8) + (" \u2026" if value.size > 8 else "")
    elif isinstance(value, (list, tuple)):
        head = ", ".join(repr(v) for v in value[:6])
        text = f"[{len(value)} items] {head}" + (", \u2026" if len(value) > 6 else "")
    elif isinstance(value, float):
        text = f"{value:.7g}"      # f32 values: as many digits as they hold
    else:
        text = repr(value)
    return _clip(text, n)


def gguf_html(f, max_rows: int = 200) -> str:
    """A GGUF file: version, alignment, a metadata table and a tensor table (the first
    `max_rows` of each)."""
    if getattr(f, "closed", False):
        return _title("GGUF", str(getattr(f, "path", "")), "closed")
    try:
        meta, tensors = dict(f.metadata), list(f.tensors)
        version, alignment = f.version, f.alignment
    except (GGMLError, OSError, ValueError, AttributeError) as e:
        return _title("GGUF", "", f"unavailable: {_e(e)}")
    types = getattr(f, "metadata_types", None) or {}
    mrows = [[f"<code>{_e(k)}</code>", _e(types.get(k, type(v).__name__)), _e(_short(v))]
             for k, v in list(meta.items())[:max_rows]]
    trows = [[f"<code>{_e(t.name)}</code>", _e(tuple(t.shape)), _e(t.type), _e(t.offset),
              _e(_size(t.nbytes))] for t in tensors[:max_rows]]
    total = sum(int(t.nbytes) for t in tensors)
    path = getattr(f, "path", "")
    parts = ["<div>", _title("GGUF", str(path), f"version {_e(version)}, "
                             f"alignment {_e(alignment)}, "
                             f"{len(meta)} keys, {len(tensors)} tensors, {_e(_size(total))}"),
             '<details open><summary style="font-family:sans-serif">metadata</summary>',
             _table(mrows, ["key", "type", "value"]),
             _more(len(meta), max_rows), "</details>",
             '<details open><summary style="font-family:sans-serif">tensors</summary>',
             _table(trows, ["name", "shape", "type", "offset", "bytes"]) if trows else
             '<span style="color:#888">no tensors</span>',
             _more(len(tensors), max_rows), "</details></div>"]
    return "".join(parts)


def _more(n: int, shown: int) -> str:
    return f'<div style="color:#888">\u2026 and {n - shown} more</div>' if n > shown else ""
