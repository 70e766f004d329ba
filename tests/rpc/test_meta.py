"""Tensor parallelism through ggml's meta device (issue 34): over the session's two RPC servers
(and CUDA0/CUDA1 where present), results equal to one device at test-backend-ops' thresholds,
every refusal with its message, the split callback's errors raised to the caller."""
import subprocess
import sys

import numpy as np
import pytest

import ggml_py as gg
from support import child_env, nmse
from support.meta_models import meta_supported
from support.meta_models import (ATTN_SPLIT, MLP_SPLIT, attn, attn_numpy, attn_weights, mlp,
                         mlp_numpy, mlp_weights, run)

pytestmark = pytest.mark.skipif(not meta_supported(),
                                reason="ggml_py offers meta devices from ggml 0.26.0")

MM_NMSE = 5e-4        # test-backend-ops: mul_mat's max NMSE
OP_NMSE = 1e-7        # test-backend-ops: the default


def _cuda_pair():
    names = [d.name for d in gg.devices() if d.name.startswith("CUDA")]
    return names[:2] if len(names) >= 2 else None


PARTS = ["rpc"] + (["cuda"] if _cuda_pair() else [])


@pytest.fixture(params=PARTS)
def parts(request, rpc_servers):
    if request.param == "rpc":
        return [s.device for s in rpc_servers]
    return [gg.device(n) for n in _cuda_pair()]


def one_device(parts):
    return parts[0]


def test_device_facts(parts):
    md = gg.meta_device(parts, {})
    assert md.type == "meta"
    assert md.parts == tuple(parts)
    assert "meta" in repr(md) and md.allreduce in repr(md)
    assert md.allreduce.endswith("comm") or md.allreduce == "generic"
    assert md.buffer_type.device == md
    with md.backend() as be:
        assert be.allreduce == md.allreduce and "allreduce=" in repr(be)
        assert be.device is md
    assert "<table>" in md._repr_html_()
    with pytest.raises(gg.UnsupportedError, match="no registry"):
        md.registry


def test_rpc_uses_the_servers_allreduce(rpc_servers):
    """RPC protocol 8 offers ggml_backend_comm_init: the meta backend uses it."""
    md = gg.meta_device([s.device for s in rpc_servers], {})
    assert md.allreduce == "RPC comm"


def test_allreduce_choice(rpc_servers, rng):
    """allreduce= says which all-reduce the meta backend uses; RPC servers' own cannot be
    declined (refused before ggml), CPU parts have none (generic either way)."""
    rpc = [s.device for s in rpc_servers]
    assert gg.meta_device(rpc, {}, allreduce="backend").allreduce == "RPC comm"
    assert gg.meta_device(rpc, {}).allreduce == "RPC comm"          # auto
    with pytest.raises(gg.UnsupportedError, match="RPC devices.*no way to decline"):
        gg.meta_device(rpc, {}, allreduce="generic")
    for bad in ("nccl", None, 1):
        with pytest.raises(gg.InvalidArgument, match="allreduce must be one of"):
            gg.meta_device(rpc, {}, allreduce=bad)
    cpu = [gg.device("CPU"), gg.device("CPU")]
    w = mlp_weights(rng)
    for choice in ("auto", "backend", "generic"):
        md = gg.meta_device(cpu, MLP_SPLIT, allreduce=choice)
        assert md.allreduce == "generic"
        with md.backend() as be:
            assert be.allreduce == "generic"
            assert nmse(run(be, w, mlp), mlp_numpy(w)) < MM_NMSE


@pytest.mark.skipif(_cuda_pair() is None, reason="needs two CUDA devices")
def test_cuda_allreduce_choice_computes_the_same(rng):
    """On two CUDA devices each choice computes the MLP equal to one device; virtual devices
    of one GPU (one PCI bus id) take the generic all-reduce by default."""
    cuda = [gg.device(n) for n in _cuda_pair()]
    virtual = len({d.device_id.rsplit("-v", 1)[0] for d in cuda}) == 1
    w = mlp_weights(rng)
    with cuda[0].backend() as be:
        ref = run(be, w, mlp)
    for choice, expect in (("auto", "generic" if virtual else "CUDA comm"),
                           ("backend", "CUDA comm"), ("generic", "generic")):
        md = gg.meta_device(cuda, MLP_SPLIT, allreduce=choice)
        assert md.allreduce == expect, choice
        with md.backend() as be:
            assert nmse(run(be, w, mlp), ref) < MM_NMSE, choice
    assert "GGML_CUDA_ALLREDUCE" not in __import__("os").environ   # put back after creation


@pytest.mark.parametrize("split,b_split", [
    (gg.Split(axis=0), None),                              # column parallel: output split
    (gg.Split(axis=1), gg.Split(axis=1)),                  # row parallel: partial sums
    (gg.Split(axis=0, sizes=[2, 4]), None),                # uneven, given
])
def test_matmul_equals_one_device(parts, rng, split, b_split):
    w = {"w": rng.standard_normal((6, 8)).astype(np.float32),
         "x": rng.standard_normal((4, 8)).astype(np.float32)}
    spec = {"w": split} if b_split is None else {"w": split, "x": b_split}
    md = gg.meta_device(parts, spec)
    with one_device(parts).backend() as be:
        ref = run(be, w, lambda t: gg.mul_mat(t["w"], t["x"]))
    with md.backend() as be:
        got = run(be, w, lambda t: gg.meta_reduce(gg.mul_mat(t["w"], t["x"])))
    assert nmse(got, ref) < MM_NMSE
    assert nmse(got, w["x"] @ w["w"].T) < MM_NMSE


def test_mlp_column_then_row_equals_one_device(parts, rng):
    w = mlp_weights(rng)
    with one_device(parts).backend() as be:
        ref = run(be, w, mlp)
    with gg.meta_device(parts, MLP_SPLIT).backend() as be:
        got = run(be, w, mlp)
    assert nmse(got, ref) < MM_NMSE and nmse(got, mlp_numpy(w)) < MM_NMSE


def test_attention_heads_split_equals_one_device(parts, rng):
    w = attn_weights(rng)
    with one_device(parts).backend() as be:
        ref = run(be, w, lambda t: attn(t, 4))
    with gg.meta_device(parts, ATTN_SPLIT).backend() as be:
        got = run(be, w, lambda t: attn(t, 4))
    assert nmse(got, ref) < MM_NMSE and nmse(got, attn_numpy(w, 4)) < MM_NMSE


def test_fused_qkv_as_segments(parts, rng):
    """A fused QKV weight split as three segments: each device gets a slice of Q, K and V."""
    d, t = 16, 4
    wqkv = rng.standard_normal((3 * d, d)).astype(np.float32)
    x = rng.standard_normal((t, d)).astype(np.float32)
    md = gg.meta_device(parts, {"wqkv": gg.Split(axis=0, segments=[d, d, d])})
    with md.backend() as be, gg.Context() as ctx, gg.Context() as xctx:
        ctx.tensor(gg.f32, (3 * d, d), "wqkv")
        ctx.alloc(be)
        assert [w for _, w in md.where(ctx.tensors[0])] == [
            (slice(0, 8), slice(16, 24), slice(32, 40)),
            (slice(8, 16), slice(24, 32), slice(40, 48))]
        w = ctx.tensors[0]
        w.set(wqkv)                      # set and read back through the segments
        np.testing.assert_array_equal(w.numpy(), wqkv)
        xt = xctx.tensor(gg.f32, (t, d), "x")    # (a second alloc of ctx is refused)
        xctx.alloc(be)
        # ggml drops the segments in the matmul's result (its columns come out in device
        # order, measured in test_segmented_matmul_order_in_ggml): refused
        with pytest.raises(gg.InvalidArgument, match="segmented .*device order"):
            be.compute(gg.Graph(gg.mul_mat(w, xt)))


def test_segmented_matmul_order_in_ggml(rng):
    """What ggml computes for a fused weight's matmul (the raw path, no checks): the right
    numbers in device order, so reading it gives a permuted result (upstream issue text in
    docs/upstream-issues.md)."""
    code = r"""
import numpy as np, ggml_py as gg
from ggml_py._backend import Backend
d, t = 16, 4
rng = np.random.default_rng(0)
wqkv = rng.standard_normal((3 * d, d)).astype(np.float32)
x = rng.standard_normal((t, d)).astype(np.float32)
md = gg.meta_device([gg.device("CPU")] * 2, {"wqkv": gg.Split(axis=0, segments=[d, d, d])})
with md.backend() as be, gg.Context() as ctx:
    w, xt = ctx.from_numpy(wqkv, "wqkv"), ctx.from_numpy(x, "x")
    ctx.alloc(be); w.set(wqkv); xt.set(x)
    y = gg.mul_mat(w, xt)
    Backend.compute(be, gg.Graph(y))
    got = np.empty((t, 3 * d), np.float32)
    gg.lib.ggml_backend_tensor_get(y.ptr, gg.ffi.from_buffer("void *", got), 0, got.nbytes)
ref = x @ wqkv.T
h = d // 2
order = [*range(0, h), *range(d, d + h), *range(2 * d, 2 * d + h),
         *range(h, d), *range(d + h, 2 * d), *range(2 * d + h, 3 * d)]
print("ERR", float(np.abs(got - ref).max()), float(np.abs(got - ref[:, order]).max()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(), timeout=120)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("ERR")]
    assert line, out.stderr[-2000:]
    plain, permuted = map(float, line[0].split()[1:])
    assert plain > 1 and permuted < 1e-4


def test_where_each_slice_lives(parts, rng):
    md = gg.meta_device(parts, {"w": gg.Split(axis=0)})
    with md.backend() as be, gg.Context() as ctx:
        w = ctx.tensor(gg.f32, (6, 8), "w")
        x = ctx.tensor(gg.f32, (6, 8), "x")
        ctx.alloc(be)
        assert md.where(w) == [(parts[0].name, (slice(0, 3), slice(None))),
                               (parts[1].name, (slice(3, 6), slice(None)))]
        assert [s for _, s in md.where(x)] == ["all (mirrored)"] * 2


# -- refusals ---------------------------------------------------------------------------------

def test_reading_a_partial_result_is_refused(parts, rng):
    md = gg.meta_device(parts, {"w": gg.Split(axis=1), "x": gg.Split(axis=1)})
    W = rng.standard_normal((6, 8)).astype(np.float32)
    X = rng.standard_normal((4, 8)).astype(np.float32)
    with md.backend() as be, gg.Context() as ctx:
        w, x = ctx.from_numpy(W, "w"), ctx.from_numpy(X, "x")
        ctx.alloc(be)
        w.set(W)
        x.set(X)
        y = gg.mul_mat(w, x)
        with pytest.raises(gg.InvalidArgument, match="last node .*MUL_MAT.* is PARTIAL"):
            be.compute(gg.Graph(y))
        z = gg.meta_reduce(y)
        be.compute(gg.Graph(z))
        with pytest.raises(gg.InvalidArgument, match="PARTIAL .*cannot read it"):
            y.numpy()
        assert nmse(z.numpy(copy=True), X @ W.T) < MM_NMSE


def test_unsupported_mul_mat_split_is_refused_with_op_and_states(parts, rng):
    md = gg.meta_device(parts, {"w": gg.Split(axis=1)})       # inner axis, input mirrored
    with md.backend() as be, gg.Context() as ctx:
        w = ctx.tensor(gg.f32, (6, 8), "w")
        x = ctx.tensor(gg.f32, (4, 8), "x")
        ctx.alloc(be)
        with pytest.raises(gg.InvalidArgument,
                           match=r"MUL_MAT .*unsupported mul_mat split states.*"
                                 r"w \(NONE\): ggml axis 0, x \(NONE\): MIRRORED"):
            be.compute(gg.Graph(gg.mul_mat(w, x)))


def test_softmax_split_along_rows_is_refused(parts):
    md = gg.meta_device(parts, {"a": gg.Split(axis=-1)})
    with md.backend() as be, gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 8), "a")
        ctx.alloc(be)
        with pytest.raises(gg.InvalidArgument, match="SOFT_MAX.*reads whole rows"):
            be.compute(gg.Graph(gg.soft_max(a)))


@pytest.mark.parametrize("spec,match", [
    ({"w": gg.Split(axis=2)}, "has 2 axes"),
    ({"w": gg.Split(axis=0, sizes=[1, 2])}, "add up to 3, not the axis length 6"),
    ({"w": gg.Split(axis=0, sizes=[6])}, "1 entries for 2 devices"),
    ({"w": gg.Split(axis=0, segments=[2, 2])}, "segments .* add up to 4"),
    ({"w": gg.Split.PARTIAL}, None),
])
def test_bad_splits_raise_before_ggml(parts, spec, match):
    md = gg.meta_device(parts, spec)
    with md.backend() as be, gg.Context() as ctx:
        ctx.tensor(gg.f32, (6, 8), "w")
        if match is None:
            ctx.alloc(be)          # PARTIAL f32 is accepted; f16 is not:
            ctx2 = gg.Context()
            ctx2.tensor(gg.f16, (6, 8), "w")
            with pytest.raises(gg.InvalidArgument, match="f32 tensors only"):
                ctx2.alloc(be)
            ctx2.close()
            return
        with pytest.raises(gg.InvalidArgument, match=match):
            ctx.alloc(be)


def test_meta_device_arguments(parts):
    with pytest.raises(gg.InvalidArgument, match="1 to 16 devices"):
        gg.meta_device([parts[0]] * 17, {})
    with pytest.raises(gg.InvalidArgument, match="1 to 16 devices"):
        gg.meta_device([], {})
    with pytest.raises(gg.InvalidType, match="split must be a callable"):
        gg.meta_device(parts, 3)
    with pytest.raises(gg.InvalidType, match="maps names to gg.Split"):
        gg.meta_device(parts, {"w": 0})
    md = gg.meta_device(parts, {})
    with pytest.raises(gg.InvalidArgument, match="do not nest"):
        gg.meta_device([md, parts[0]], {})
    with pytest.raises(gg.InvalidType, match="axis must be an int"):
        gg.Split(axis="0")


def test_a_python_exception_in_split_reaches_the_caller(parts):
    class Boom(Exception):
        pass

    def split(t):
        if t.name == "w":
            raise Boom("no split for w")
        return None

    md = gg.meta_device(parts, split)
    with md.backend() as be, gg.Context() as ctx:
        ctx.tensor(gg.f32, (6, 8), "w")
        with pytest.raises(Boom, match="no split for w"):
            ctx.alloc(be)


def test_split_returning_a_wrong_type_is_refused(parts):
    md = gg.meta_device(parts, lambda t: "rows")
    with md.backend() as be, gg.Context() as ctx:
        ctx.tensor(gg.f32, (6, 8), "w")
        with pytest.raises(gg.InvalidType, match="returned str"):
            ctx.alloc(be)


def test_callable_split(parts, rng):
    w = mlp_weights(rng)
    md = gg.meta_device(parts, lambda t: MLP_SPLIT.get(t.name))
    with md.backend() as be:
        got = run(be, w, mlp)
    assert nmse(got, mlp_numpy(w)) < MM_NMSE


def test_split_callback_survives_its_device_object(parts, rng):
    """ggml keeps every meta device (and calls its split callback) until exit: dropping the
    Python objects must not leave it calling into freed memory."""
    import gc
    w = mlp_weights(rng)
    md = gg.meta_device(parts, dict(MLP_SPLIT))
    be = md.backend()
    del md
    gc.collect()
    got = run(be, w, mlp)
    be.close()
    assert nmse(got, mlp_numpy(w)) < MM_NMSE


def test_display_shows_where_each_slice_lives(parts):
    md = gg.meta_device(parts, {"w": gg.Split(axis=0)})
    with md.backend() as be, gg.Context() as ctx:
        w = ctx.tensor(gg.f32, (6, 8), "w")
        ctx.alloc(be)
        html = w._repr_html_()
        assert f"{parts[0].name}: <code>[0:3, :]</code>" in html
        assert f"{parts[1].name}: <code>[3:6, :]</code>" in html


def _svg_boxes(svg):
    """[(tooltip, the box's outline, [(class, x, y, w, h, fill) of the fills inside it])]."""
    import xml.etree.ElementTree as ET
    ns = "{http://www.w3.org/2000/svg}"
    out = []
    for g in ET.fromstring(svg).iter(ns + "g"):
        title = g.find(ns + "title")
        if title is None:
            continue
        rects = list(g.iter(ns + "rect"))
        fills = [(r.get("class"), *(float(r.get(k)) for k in ("x", "y", "width", "height")),
                  r.get("fill")) for r in rects if r.get("class")]
        out.append((title.text, [r for r in rects if not r.get("class")][-1], fills))
    return out


def test_graph_picture_shows_where_each_tensor_lives(parts):
    """The graph SVG of a meta graph: each box in its devices' colours, as wide as each
    device's slice (rows as bands, columns as stripes), partial sums dotted, mirrored grey."""
    from ggml_py import _display_graph as DG
    md = gg.meta_device(parts, {"w1": gg.Split(axis=0, sizes=[2, 4]),
                                "w2": gg.Split(axis=1, sizes=[2, 4])})
    with md.backend() as be, gg.Context() as ctx:
        w1 = ctx.tensor(gg.f32, (6, 8), "w1")
        w2 = ctx.tensor(gg.f32, (8, 6), "w2")
        x = ctx.tensor(gg.f32, (4, 8), "x")
        ctx.alloc(be)
        h = gg.relu(gg.mul_mat(w1, x))
        h.name = "h"
        p = gg.mul_mat(w2, h)
        p.name = "p"
        y = gg.add(x, p)
        y.name = "y"
        svg = DG.graph_svg(gg.Graph(y))
    boxes = {tip.split(" / ")[0] if tip.split(" / ")[0] in ("w1", "w2", "x")
             else tip.split(" / ")[1]: (outline, fills) for tip, outline, fills in _svg_boxes(svg)}
    assert {"w1", "w2", "x", "h", "p", "y"} <= set(boxes)
    for name in (parts[0].name, parts[1].name, "mirrored (on each)"):
        assert f">{name}<" in svg                                   # the legend
    _, f = boxes["w1"]                     # numpy axis 0 (rows): bands of 2 and 4 rows
    assert [c for c, *_ in f] == ["part0", "part1"]
    assert f[0][2] < f[1][2] and f[1][4] == pytest.approx(2 * f[0][4], abs=0.2)
    assert f[0][3] == f[1][3]
    assert [r[5] for r in f] == DG.FILLS[:2]                        # the legend's colours
    for name in ("w2", "h"):               # the last axis (columns): stripes of 2 and 4
        _, f = boxes[name]
        assert [c for c, *_ in f] == ["part0", "part1"], name
        assert f[1][3] == pytest.approx(2 * f[0][3], abs=0.2) and f[0][4] == f[1][4]
    outline, f = boxes["p"]                # W2 h: each device holds a share of a sum
    assert outline.get("stroke-dasharray") == "2 2" and len(f) == 2
    for name in ("x", "y"):                # mirrored; y is reduced, on each device
        outline, f = boxes[name]
        assert [c for c, *_ in f] == ["mirrored"] and outline.get("stroke-dasharray") is None
        assert f[0][5] == DG.MIRRORED_FILL
    assert ">partial sums<" in svg and ">mirrored<" in svg


def test_graph_picture_of_a_refused_meta_graph_shows_no_placement(parts):
    md = gg.meta_device(parts, {"w1": gg.Split(axis=0, sizes=[2, 4]),
                                "w2": gg.Split(axis=1, sizes=[3, 3])})    # slices disagree
    from ggml_py import _display_graph as DG
    with md.backend() as be, gg.Context() as ctx:
        w1 = ctx.tensor(gg.f32, (6, 8), "w1")
        w2 = ctx.tensor(gg.f32, (8, 6), "w2")
        x = ctx.tensor(gg.f32, (4, 8), "x")
        ctx.alloc(be)
        g = gg.Graph(gg.mul_mat(w2, gg.mul_mat(w1, x)))
        svg = DG.graph_svg(g)
        assert 'class="part' not in svg and "mirrored (on each)" not in svg
        with pytest.raises(gg.InvalidArgument):
            be.compute(g)


def test_scheduler_refuses_a_meta_backend(parts):
    with gg.meta_device(parts, {}).backend() as be, gg.device("CPU").backend() as cpu:
        with pytest.raises(gg.UnsupportedError, match="meta device's backend"):
            gg.Scheduler([be, cpu])


def test_training_refuses_a_meta_backend(parts, rng):
    """ggml's meta backend asserts that a graph has no gradients: refused first."""
    from ggml_py import opt
    with gg.meta_device(parts, {}).backend() as be, gg.Context() as ctx:
        w = ctx.tensor(gg.f32, (4, 4), "w")
        ctx.alloc(be)
        loss = gg.sum(gg.mul_mat(w, w))
        with pytest.raises(gg.UnsupportedError, match="no backward graphs"):
            opt.gradients(loss, [w], be)
