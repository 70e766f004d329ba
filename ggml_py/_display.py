"""Rich and plain displays of ggml_py objects, for Jupyter and the terminal.

Pure functions over the objects' public attributes; the classes call them lazily from
``_repr_html_``, ``__repr__`` and ``to_svg`` (the graph picture is drawn in
:mod:`ggml_py._display_graph`). A display never raises: a closed object, a
tensor without memory or a server that went away is said in words instead.

    >>> from ggml_py._display import tensor_repr       # doctest: +SKIP
    >>> print(tensor_repr(t))
    <Tensor 'x' f32 (2, 3) on CPU>
    [[0. 1. 2.]
     [3. 4. 5.]]
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from ._display_graph import (PALETTE, _backend_labels, _clip, _e, _last_graph, _safe,
                             graph_svg, splits)
from .errors import GGMLError

FETCH_LIMIT = 8 << 20    # bytes of a device tensor fetched to show its values

_BOX = "font-family:monospace;font-size:12px;border-collapse:collapse"
_TD = "padding:2px 8px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top"


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


def _max_size(n: int) -> str:
    return "no limit" if n >= (1 << 62) else _size(n)     # ggml says SIZE_MAX for none


def _table(rows: Iterable[Sequence[str]], header: Sequence[str] | None = None) -> str:
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


def _plural(n: Any, one: str, many: str | None = None) -> str:
    """"1 split", "2 splits" ("?" when unknown)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _title(kind: str, name: str, extra: str = "") -> str:
    return (f'<div style="font-family:sans-serif;margin-bottom:4px"><b>{_e(kind)}</b> '
            f'<code>{_e(name)}</code> <span style="color:#666">{extra}</span></div>')


# -- devices ---------------------------------------------------------------------------------

def _memory_bar(mem: tuple[int, int] | None, width: int = 160) -> str:
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


def _caps(dev: Any) -> str:
    caps = _safe(lambda: dev.caps)
    if caps is None:
        return '<span style="color:#888">unknown</span>'
    return "".join(_badge(k.rstrip("_"), bool(v)) for k, v in caps._asdict().items())


def device_repr(dev: Any) -> str:
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


def device_html(dev: Any) -> str:
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


def devices_html(devices: Iterable[Any] | None = None) -> str:
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

def buffer_html(buf: Any) -> str:
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

def _where(t: Any) -> str | None:
    buf = _safe(lambda: t.buffer)
    if buf is None:
        return None
    return _safe(lambda: buf.buffer_type.name) or _safe(lambda: buf.name) or "?"


def _values(t: Any) -> tuple[np.ndarray[Any, Any] | None, str]:
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


def _preview(a: np.ndarray[Any, Any]) -> str:
    with np.printoptions(threshold=120, edgeitems=3, precision=4, linewidth=88):
        return np.array2string(a, separator=" ")


def _strides(t: Any) -> tuple[int, ...]:
    return tuple(reversed(t.nb[: t.ndim]))


def tensor_repr(t: Any) -> str:
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


def _meta_rows(t: Any) -> list[list[str]]:
    """On a meta device: which slice (numpy indices) lives on which part."""
    from . import _meta_plan
    dev = _safe(lambda: _meta_plan.meta_of_tensor(t), None)
    if dev is None:
        return []
    placed = _safe(lambda: dev.where(t), None)
    if placed is None:
        return [["split", "<i>not known (the meta backend refuses this tensor)</i>"]]
    return [["split", "<br>".join(f"{_e(name)}: <code>{_e(_slices(cut))}</code>"
                                  for name, cut in placed)]]


def _slices(cut: Any) -> str:
    if isinstance(cut, str):
        return cut
    return "[" + ", ".join(":" if s == slice(None) else f"{s.start}:{s.stop}" for s in cut) + "]"


def tensor_html(t: Any) -> str:
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
    rows += _meta_rows(t)
    values, why = _values(t) if where else (None, "no memory yet: allocate its context "
                                            "(ctx.alloc(backend)) or compute its graph")
    body = (f'<pre style="margin:4px 0;font-size:12px">{_e(_preview(values))}</pre>'
            if values is not None else
            f'<div style="color:#888;font-family:sans-serif">{_e(why)}</div>')
    fetched = "" if values is None or t.is_host else " &middot; values fetched from the device"
    return ("<div>" + _title("Tensor", name or "(unnamed)", fetched) + _table(rows) + body
            + "</div>")


# -- graphs ----------------------------------------------------------------------------------


def scheduler_html(sched: Any, graph: Any = None) -> str:
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
                  _plural(_safe(lambda: sched.n_splits, '?'), "split") + ", "
                  + _plural(_safe(lambda: sched.n_tensor_copies, '?'), "tensor")
                  + " copied between backends, "
                  + _plural(_safe(lambda: sched.n_graph_copies, '?'), "graph copy", "graph copies")
                  + " (the last graph)")
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

def _short(value: Any, n: int = 80) -> str:
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


def gguf_html(f: Any, max_rows: int = 200) -> str:
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
