"""Child process: op cells and speed rounds on the one build this process loads.

    GGML_PY_BUILD=<folder> python -m ggml_py.compare._worker ops CELLS.json START
    GGML_PY_BUILD=<folder> python -m ggml_py.compare._worker speed SPEC.json

``ops`` runs cells (device, op, type) from index START, printing ``> i`` before a cell and
``= i {json}`` after it: when a kernel aborts the process, the parent sees which cell was
running, records a crash for it and starts a new worker at the next cell. ``speed`` builds
each op's graph once and then, for every ``round`` line read on stdin, times each graph and
prints one JSON line; the parent alternates rounds between the two sides so that drift of the
machine falls on both.
"""
from __future__ import annotations

import base64
import json
import sys
import time

import numpy as np

from ._cases import BY_OP, In, nmse, seed, threshold, values


def _devices(gg, want_rpc: bool, threads: int | None = None):
    """{name: Device}: the local devices, plus one RPC device served by this build."""
    server = None
    if want_rpc and "rpc" in gg.build_info()["backends"]:
        try:
            server = gg.rpc.serve(threads=threads)
            gg.rpc.connect(server.endpoint)
        except gg.GGMLError as e:
            print(f"! rpc {type(e).__name__}: {e}", flush=True)
    return {d.name: d for d in gg.devices()}, server


def _make(gg, ctx, spec: In, type_name: str):
    if spec.role == "T":
        t = gg.TYPES[type_name]
    elif spec.role in ("idx", "pos"):
        t = gg.i32
    else:
        t = gg.TYPES[spec.role]
    return ctx.tensor(t, spec.shape)


def _fill(t, arr: np.ndarray) -> None:
    dt = t.dtype
    if dt is None:                       # quantized / bf16: floats are converted on the way in
        t.set(arr.astype(np.float32))
    elif np.issubdtype(dt, np.integer) and arr.dtype.kind == "f":
        t.set(np.clip(np.round(arr * 4), np.iinfo(dt).min, np.iinfo(dt).max).astype(dt))
    else:
        t.set(arr.astype(dt))


def _addr(gg, x) -> int | None:
    try:
        if gg.ffi.typeof(x).kind == "pointer":
            return int(gg.ffi.cast("uintptr_t", x))
    except TypeError:
        pass
    return None


def _recorded(gg, case, ph_ctx, placeholders):
    """The raw calls ggml_py makes to build `case` on `placeholders` (its inputs as f32, a type
    every rule takes): [(kind, fn or tensor args, args, ndim, result address)], recorded at
    Context.tensor and Context.build, where every op's Python path creates what it builds."""
    from ggml_py._context import Context
    calls: list = []
    orig_build, orig_tensor = Context.build, Context.tensor

    def build(self, fn, args, ndim, *rest, **kw):
        t = orig_build(self, fn, args, ndim, *rest, **kw)
        calls.append(("build", fn, tuple(args), t.ndim, _addr(gg, t.ptr)))
        return t

    def tensor(self, type, shape, name=None):
        t = orig_tensor(self, type, shape, name)
        calls.append(("tensor", type, tuple(shape), None, _addr(gg, t.ptr)))
        return t

    Context.build, Context.tensor = build, tensor
    try:
        case.build(gg, *placeholders)
    finally:
        Context.build, Context.tensor = orig_build, orig_tensor
    return calls


def build_raw(gg, ctx, case, type_name: str, ins):
    """`case` built on `ins` with ggml's own calls, without ggml_py's rules: the calls ggml_py
    makes for f32 operands (recorded on placeholders), replayed on the cell's typed tensors.
    ggml's own asserts still run (an abort here is the build's answer)."""
    with gg.Context() as ph_ctx:
        ph = [_make(gg, ph_ctx, s, "f32") for s in case.inputs]
        calls = _recorded(gg, case, ph_ctx, ph)
        mapping = {_addr(gg, p.ptr): t for p, t in zip(ph, ins)}
    out = None
    for kind, fn, args, ndim, res in calls:
        if kind == "tensor":
            out = ctx.tensor(fn, args)
        else:
            new = [mapping[a].ptr if (a := _addr(gg, x)) in mapping else x for x in args]
            out = ctx.build(fn, new, ndim, room=16)
        mapping[res] = out
    if out is None:
        raise gg.GGMLError(f"{case.op}: ggml_py built nothing to replay")
    return out


def rule_of(gg, case, type_name: str) -> dict:
    """ggml_py's rule for the cell: its op called on the cell's typed inputs (nothing run)."""
    with gg.Context() as ctx:
        try:
            ins = [_make(gg, ctx, s, type_name) for s in case.inputs]
            case.build(gg, *ins)
        except gg.GGMLError as e:
            return {"rule": "refused", "rule_error": f"{type(e).__name__}: {e}"}
    return {"rule": "allowed"}


def _run_cell(gg, dev, backend, case, type_name: str) -> dict:
    op = case.op
    rng = np.random.default_rng(seed(op, type_name))
    with gg.Context() as ctx:
        try:
            ins = [_make(gg, ctx, s, type_name) for s in case.inputs]
        except gg.GGMLError as e:          # (ggml_new_tensor would assert: no cell to run)
            return {"status": "refused", "error": f"inputs: {type(e).__name__}: {e}"}
        print(f"stage build {op} {type_name}", flush=True)
        try:
            out = build_raw(gg, ctx, case, type_name, ins)
        except gg.GGMLError as e:
            return {"status": "error", "error": f"building: {type(e).__name__}: {e}"}
        if not bool(gg.lib.ggml_backend_dev_supports_op(dev.ptr, out.ptr)):
            return {"status": "unsupported"}
        ctx.alloc(backend)
        first_rows = case.inputs[0].shape[0] if case.inputs[0].shape else None
        for s, t in zip(case.inputs, ins):
            _fill(t, values(s, rng, first_rows))
        held = [np.asarray(t.numpy(copy=True), dtype=np.float64) if s.role not in ("idx", "pos")
                else t.numpy(copy=True).astype(np.int64) for s, t in zip(case.inputs, ins)]
        print(f"stage compute {op} {type_name}", flush=True)
        try:
            backend.compute(gg.Graph(out))
        except gg.UnsupportedError as e:  # (a node the replay made that the device lacks)
            return {"status": "unsupported", "error": f"{type(e).__name__}: {e}"}
        except gg.GGMLError as e:
            return {"status": "error", "error": f"{type(e).__name__}: {e}"}
        try:
            got = np.asarray(out.numpy(copy=True), dtype=np.float64)
        except gg.GGMLError as e:
            return {"status": "error", "error": f"reading the result: {type(e).__name__}: {e}"}
    ref = np.asarray(case.ref(*held), dtype=np.float64)
    if case.normalize is not None:
        got, ref = case.normalize(got.reshape(ref.shape)), case.normalize(ref)
    err = nmse(got, ref)
    tol = threshold(case, type_name)
    out32 = got.astype(np.float32).reshape(-1)
    return {"status": "ok" if err <= tol else "fail", "nmse": err if np.isfinite(err) else None,
            "threshold": tol, "out": base64.b64encode(out32.tobytes()).decode()}


ABORT_ENV = "GGML_PY_COMPARE_ABORT_AT"   # "device/op/type": ggml_abort() there (tests the isolation)


def ops_main(cells_path: str, start: int) -> int:
    import os

    import ggml_py as gg
    cells = json.loads(open(cells_path).read())
    abort_at = os.environ.get(ABORT_ENV)
    devs, server = _devices(gg, any(d.startswith("RPC") for d, _, _ in cells))
    backends = {}
    for i in range(start, len(cells)):
        dname, op, ty = cells[i]
        print(f"> {i}", flush=True)
        if abort_at == f"{dname}/{op}/{ty}":
            msg = gg.ffi.new("char[]", f"abort requested at {abort_at}".encode())
            gg.lib.ggml_abort(b"compare", 0, b"%s", msg)
        dev = devs.get(dname)
        rule: dict = {}
        if dev is None:
            res = {"status": "absent"}
        else:
            try:
                if dname not in backends:
                    backends[dname] = dev.backend()
                case = BY_OP[op]
                rule = rule_of(gg, case, ty)
                print(f"rule {json.dumps(rule)}", flush=True)   # (kept by the parent on abort)
                res = {**_run_cell(gg, dev, backends[dname], case, ty), **rule}
            except gg.GGMLError as e:     # e.g. the device refused the buffer
                res = {"status": "error", "error": f"{type(e).__name__}: {e}", **rule}
        if server is not None and dname.startswith("RPC") and not server.alive:
            # the server died in this cell (ggml_py's client raised instead of aborting): a
            # crash of this cell, with ggml_py's rule for it as when the worker itself aborts;
            # a new worker with a new server takes the next one
            err = server.proc.stderr.read().decode(errors="replace") if server.proc.stderr else ""
            tail = " | ".join(ln for ln in err.splitlines() if ln.strip())[-400:]
            crash = {"status": "crash", "error": f"the RPC server died: {tail}", **rule}
            print(f"= {i} {json.dumps(crash)}", flush=True)
            return 0
        print(f"= {i} {json.dumps(res)}", flush=True)
    for be in backends.values():
        be.close()
    if server is not None:
        server.close()
    return 0


def _speed_graphs(gg, devs, spec, threads):
    """[(device, op, backend, ctx, graph)] for the speed table: f32 inputs of the cases'
    `speed` shapes, one context per graph, skipping what a side refuses."""
    rng = np.random.default_rng(0)
    graphs, skipped = [], {}
    for dname in spec["devices"]:
        dev = devs.get(dname)
        if dev is None:
            continue
        be = dev.backend(n_threads=threads) if threads and dev.type == "cpu" else dev.backend()
        for op in spec["ops"]:
            case = BY_OP[op]
            ctx = gg.Context()
            try:
                ins = [_make(gg, ctx, s, "f32") for s in case.speed]
                out = case.build(gg, *ins)
                if not dev.supports_op(out):
                    raise gg.UnsupportedError(f"{dname} does not support {op}")
                ctx.alloc(be)
                first_rows = case.speed[0].shape[0]
                for s, t in zip(case.speed, ins):
                    _fill(t, values(s, rng, first_rows))
                g = gg.Graph(out)
                be.compute(g)                           # warm up (and fail early)
            except gg.GGMLError as e:
                skipped[f"{dname}/{op}"] = f"{type(e).__name__}: {e}"
                ctx.close()
                continue
            graphs.append((dname, op, be, ctx, g, out))
    return graphs, skipped


def speed_main(spec_path: str) -> int:
    import ggml_py as gg
    spec = json.loads(open(spec_path).read())
    threads = spec.get("threads")
    devs, server = _devices(gg, any(d.startswith("RPC") for d in spec["devices"]), threads)
    graphs, skipped = _speed_graphs(gg, devs, spec, threads)
    budget = spec.get("seconds_per_op", 0.02)
    # calibrate: iterations per measurement so that one measurement takes about `budget`
    iters = {}
    for dname, op, be, _, g, out in graphs:
        t0 = time.perf_counter()
        be.compute(g)
        out.numpy(copy=True)
        dt = max(time.perf_counter() - t0, 1e-6)
        iters[(dname, op)] = max(1, min(1000, int(budget / dt)))
    print(json.dumps({"ready": True, "skipped": skipped}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        times = {}
        for dname, op, be, _, g, out in graphs:
            n = iters[(dname, op)]
            t0 = time.perf_counter()
            for _ in range(n):
                be.compute(g)
            # an RPC backend returns from compute before its server finishes: reading the
            # result back waits for every queued compute
            out.numpy(copy=True)
            times[f"{dname}/{op}"] = (time.perf_counter() - t0) / n * 1e6
        print(json.dumps({"times_us": times}), flush=True)
    for *_, ctx, _g, _out in graphs:
        ctx.close()
    if server is not None:
        server.close()
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from ggml_py._log import to_stderr
    to_stderr()        # ggml's own lines reach the parent, which reads stderr
    if argv[0] == "ops":
        return ops_main(argv[1], int(argv[2]))
    if argv[0] == "speed":
        return speed_main(argv[1])
    raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main())
