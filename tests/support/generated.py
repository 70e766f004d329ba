"""A hypothesis generator: op x layout x type x device, each case computed and checked against
numpy (test-backend-ops' NMSE) or refused cleanly, never silently wrong.

Run by tests/rpc/test_generated.py in a child process (a crash then fails the test and the last
case printed names it):

    python tests/support/generated.py --examples 200 [--devices CPU,CUDA0,RPC] [--seed N]

(by default every device of the loaded build, and an RPC server's).

Layouts: contiguous; transposed (stored transposed, viewed back with ``.T``); permuted (a 3-D
tensor stored with its axes moved, viewed back with ``permute``); strided (a view of every
row's first half of a wider tensor: packed rows, gaps between rows); broadcast (the second
operand of a binary op has axes of length 1). Operators and numpy-named functions must compute
every layout; ggml's named ops may refuse a layout their kernels cannot read, with a message.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import ggml_py as gg

LAYOUTS = ["contiguous", "transposed", "permuted", "strided", "broadcast"]
TYPES = {"f32": np.float32, "f16": np.float16}


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _sm(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# name: (arity, build, numpy reference, threshold, numpy semantics?)
OPS = {
    "a + b": (2, lambda a, b: a + b, lambda a, b: a + b, 1e-7, True),
    "a - b": (2, lambda a, b: a - b, lambda a, b: a - b, 1e-7, True),
    "a * b": (2, lambda a, b: a * b, lambda a, b: a * b, 1e-7, True),
    "a / b": (2, lambda a, b: a / b, lambda a, b: a / b, 1e-6, True),
    "b + a": (2, lambda a, b: b + a, lambda a, b: b + a, 1e-7, True),
    "a * 2.5": (1, lambda a: a * 2.5, lambda a: a * 2.5, 1e-7, True),
    "1.5 - a": (1, lambda a: 1.5 - a, lambda a: 1.5 - a, 1e-7, True),
    "a / 4": (1, lambda a: a / 4, lambda a: a / 4, 1e-7, True),
    "-a": (1, lambda a: -a, lambda a: -a, 1e-7, True),
    "a @ b.T": (2, lambda a, b: a @ b.permute(tuple(range(b.ndim - 2)) + (b.ndim - 1, b.ndim - 2)),
                lambda a, b: a @ np.swapaxes(b, -1, -2), 5e-4, True),
    "cont": (1, gg.cont, lambda a: a, 0, True),
    "relu": (1, gg.relu, lambda a: np.maximum(a, 0), 1e-7, False),
    "tanh": (1, gg.tanh, np.tanh, 1e-6, False),
    "sigmoid": (1, gg.sigmoid, _sig, 1e-6, False),
    "abs": (1, gg.abs, np.abs, 0, False),
    "sqr": (1, gg.sqr, lambda a: a * a, 1e-7, False),
    "gg.add": (2, gg.add, lambda a, b: a + b, 1e-7, False),
    "gg.mul": (2, gg.mul, lambda a, b: a * b, 1e-7, False),
    "sum_rows": (1, gg.sum_rows, lambda a: a.sum(-1, keepdims=True), 1e-6, False),
    "mean": (1, gg.mean, lambda a: a.mean(-1, keepdims=True), 1e-6, False),
    "soft_max": (1, gg.soft_max, _sm, 1e-6, False),
    "rms_norm": (1, lambda a: gg.rms_norm(a, 1e-6),
                 lambda a: a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6), 1e-6, False),
    "cumsum": (1, gg.cumsum, lambda a: np.cumsum(a, -1), 1e-6, False),
    "sum": (1, gg.sum, lambda a: np.array([a.sum()]), 1e-6, False),
}


def nmse(got, ref) -> float:
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    den = float(np.sum(ref * ref))
    return float(np.sum((got - ref) ** 2) / (den if den else 1.0))


def _place(ctx, x: np.ndarray, layout: str, t: str):
    """(tensor of `ctx` whose values read as `x`, setter to call after alloc)."""
    if layout == "transposed" and x.ndim >= 2:
        stored = np.ascontiguousarray(np.swapaxes(x, -1, -2))
        raw = ctx.tensor(t, stored.shape)
        return raw.permute(tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)), (raw, stored)
    if layout == "permuted" and x.ndim == 3:
        stored = np.ascontiguousarray(np.transpose(x, (2, 0, 1)))
        raw = ctx.tensor(t, stored.shape)
        return raw.permute((1, 2, 0)), (raw, stored)
    if layout == "strided" and x.ndim >= 2:
        wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        wide[..., : x.shape[-1]] = x
        raw = ctx.tensor(t, wide.shape)
        item = np.dtype(x.dtype).itemsize
        strides = tuple(int(s) for s in np.zeros(wide.shape, x.dtype).strides[:-1]) + (item,)
        return raw.view(x.shape, 0, strides), (raw, wide)
    raw = ctx.tensor(t, x.shape)
    return raw, (raw, x)


def run_case(case: dict, devices: dict) -> str:
    """'ok', 'refused: ...' or raises AssertionError (a wrong answer or a wrong refusal)."""
    arity, build, ref_fn, thr, numpy_semantics = OPS[case["op"]]
    rng = np.random.default_rng(case["seed"])
    shape = tuple(case["shape"])
    dt = TYPES[case["type"]]
    xs = [(rng.standard_normal(shape) + (2.5 if case["op"] in ("a / b",) else 0)).astype(dt)]
    if arity == 2:
        s2 = shape
        if case["layout"] == "broadcast":
            s2 = tuple(1 if i in case["bcast_axes"] else n for i, n in enumerate(shape))
        xs.append((rng.standard_normal(s2) + (2.5 if case["op"] == "a / b" else 0)).astype(dt))
    be = devices[case["device"]]
    with gg.Context() as ctx:
        placed = [_place(ctx, x, case["layout"] if i == 0 or case["layout"] != "broadcast" else
                         "contiguous", case["type"]) for i, x in enumerate(xs)]
        ctx.alloc(be)
        for _, (raw, data) in placed:
            raw.set(np.ascontiguousarray(data))
        try:
            out = build(*[p for p, _ in placed])
            be.compute(gg.Graph(out))
            got = out.numpy(copy=True).astype(np.float32) if out.is_contiguous else None
            out_f16 = out.type.name == "f16"
        except (gg.InvalidArgument, gg.InvalidType, gg.UnsupportedError) as e:
            assert str(e), "a refusal without a message"
            if numpy_semantics and case["type"] == "f32":
                raise AssertionError(f"numpy semantics refused an f32 case: {e}") from None
            return f"refused: {type(e).__name__}: {e}"
    ref = ref_fn(*[x.astype(np.float32) for x in xs])
    if out_f16:       # what an f16 result can hold (a square of 2e-4 is below f16's smallest)
        ref = np.asarray(ref).astype(np.float16).astype(np.float32)
    assert got is not None, "result is not contiguous"
    assert got.shape == ref.shape, f"shape {got.shape} != numpy's {ref.shape}"
    tol = thr if case["type"] == "f32" else max(thr, 1e-5) * 100
    err = nmse(got, ref) if thr else float(np.max(np.abs(got - ref)))
    assert err <= tol, f"NMSE {err:.3g} > {tol:.3g}: wrong numbers"
    return "ok"


def main(argv=None) -> int:
    from hypothesis import HealthCheck, given, seed, settings, strategies as st
    p = argparse.ArgumentParser()
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--devices", default=None,
                   help="comma-separated device names and RPC (default: every device of the "
                        "build, and an RPC server's)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    devices = {}
    servers = []
    names = args.devices.split(",") if args.devices else \
        [d.name for d in gg.devices()] + ["RPC"]   # CUDA0/CUDA1, Vulkan0... where built
    for name in names:
        if name == "RPC":
            srv = gg.rpc.serve()
            servers.append(srv)
            dev = gg.rpc.connect(srv.endpoint).devices[0]
        else:
            dev = gg.device(name)
        devices[name] = dev.backend()
    counts = {"ok": 0, "refused": 0}

    @st.composite
    def cases(draw):
        op = draw(st.sampled_from(sorted(OPS)))
        ndim = draw(st.integers(2, 3))
        shape = [draw(st.integers(1, 6)) for _ in range(ndim - 1)] + [draw(st.integers(1, 9))]
        if op == "a @ b.T":
            pass
        layout = draw(st.sampled_from(LAYOUTS))
        if layout == "broadcast" and OPS[op][0] == 1:
            layout = "contiguous"
        bcast = draw(st.sets(st.integers(0, ndim - 1), max_size=ndim)) if layout == "broadcast" else set()
        return {"op": op, "shape": shape, "layout": layout, "bcast_axes": sorted(bcast),
                "type": draw(st.sampled_from(sorted(TYPES))),
                "device": draw(st.sampled_from(sorted(devices))), "seed": draw(st.integers(0, 2**31))}

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def check(case):
        if case["op"] == "a @ b.T" and case["layout"] == "broadcast":
            case["layout"] = "contiguous"
        print("CASE " + json.dumps(case), flush=True)
        status = run_case(case, devices)
        counts["ok" if status == "ok" else "refused"] += 1
        print("RESULT " + status[:200], flush=True)

    try:
        check()
    finally:
        for b in devices.values():
            b.close()
        for s in servers:
            s.close()
        print("COUNTS " + json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
