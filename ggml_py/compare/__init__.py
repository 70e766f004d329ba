"""``python -m ggml_py compare A B``: what changed between two ggml builds.

    python -m ggml_py compare 0.25.3 0.26.0                   # terminal summary
    python -m ggml_py compare 0.25.3 0.26.0 --format html -o report.html
    python -m ggml_py compare 0.25.3 --source ~/llama.cpp/ggml --format md
    python -m ggml_py compare ggml-0.20.2-cpu-rpc ggml-0.25.3-cpu-rpc --format json --max-slowdown 1.5

A and B are pinned releases (built when missing), build folders (a path, or a folder name
under ggml_py/lib), or ggml source trees (``--source PATH`` stands for B). Each side runs in
its own processes, never in this one: the API and runtime are read by a probe process; the op
matrix by worker processes (a cell that aborts its worker is recorded as a crash and the next
worker goes on); the speed table by one persistent process per side, rounds alternating.

The exit status is 1 when something regressed (an op cell that passed on A and fails, errs or
crashes on B, or newly crashes; a function removed; an op slower than ``--max-slowdown``), 0
otherwise. The JSON keys are documented in docs/compare-schema.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from . import _diff, _report, _verdict
from ._cases import CASES, TYPES
from ._sides import (CompareError, Side, SpeedWorker, build, probe, resolve, rpc_cross,
                     run_cells)

SCHEMA_VERSION = 1
__all__ = ["compare", "main", "CompareError"]


class Progress:
    """One line on stderr, rewritten in place on a terminal (plain lines, rate-limited, else)."""

    def __init__(self, stream=sys.stderr, quiet: bool = False):
        self.stream, self.quiet = stream, quiet
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.last = 0.0

    def __call__(self, msg: str) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\x1b[K" + msg[:150])
            self.stream.flush()
        elif now - self.last > 10:
            self.stream.write(msg + "\n")
            self.stream.flush()
            self.last = now

    def done(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _cells(devices: list[str], ops: list[str], types: list[str]) -> list[list[str]]:
    return [[d, op, t] for d in devices for op in ops for t in types]


def _speed(sa: Side, sb: Side, devices: list[str], ops: list[str], rounds: int, threads: int,
           progress) -> tuple[list[dict], list[dict], dict]:
    spec = {"devices": devices, "ops": ops, "seconds_per_op": 0.02, "threads": threads}
    with tempfile.TemporaryDirectory(prefix="ggml-compare-speed-") as tmp:
        progress("speed: building graphs on both sides")
        wa = SpeedWorker(sa, spec, Path(tmp))
        try:
            wb = SpeedWorker(sb, spec, Path(tmp))
        except CompareError:
            wa.close()
            raise
        try:
            ra, rb = [], []
            for i in range(rounds):
                progress(f"speed: round {i + 1}/{rounds} (A then B)")
                ra.append(wa.round())
                rb.append(wb.round())
        finally:
            wa.close()
            wb.close()
    return ra, rb, {"a": wa.skipped, "b": wb.skipped}


def _short(s: Side) -> str:
    """A side's name in tables: what the user typed, or the build folder's name for a path."""
    return s.folder.name if os.sep in s.label else s.label


def _cross(sa: Side, sb: Side, pa: dict, pb: dict, progress) -> list[dict] | None:
    """RPC across the sides, tried: a client of each side against a server of the other,
    and each side against itself (the controls), each pair in its own processes."""
    if not (pa["runtime"].get("rpc") and pb["runtime"].get("rpc")):
        return None
    out = []
    for (rc, c), (rs, s) in ((("a", sa), ("a", sa)), (("b", sb), ("b", sb)),
                             (("a", sa), ("b", sb)), (("b", sb), ("a", sa))):
        progress(f"RPC: a {c.label} client against a {s.label} server")
        out.append({"roles": [rc, rs], **rpc_cross(c, s)})
    return out


def check_names(what: str, given: list[str] | None, valid: list[str]) -> None:
    """CompareError naming the unknown values and the valid ones (a typo in a filter would
    otherwise compare nothing and pass)."""
    if given is None:
        return
    unknown = [g for g in given if g not in valid]
    if unknown:
        raise CompareError(f"unknown {what}(s): {', '.join(unknown)}; valid: {', '.join(valid)}")


def _probe_both(sa: Side, sb: Side, progress) -> tuple[dict, dict]:
    """Build each side where missing, then read its API, runtime and identity in a probe."""
    for s in (sa, sb):
        build(s, progress)
    progress(f"probing {sa.label}")
    pa = probe(sa)
    progress(f"probing {sb.label}")
    pb = probe(sb)
    from ._identity import identify
    for p, s in ((pa, sa), (pb, sb)):
        p["side"]["label"] = s.label
        p["side"]["identity"] = identify(s.folder, list(p["api"]["functions"]))
    return pa, pb


def _matrix_axes(pa: dict, pb: dict, devices: list[str] | None, ops: list[str] | None,
                 types: list[str] | None) -> tuple[list[str], list[str], list[str], list[str]]:
    """The op matrix's devices, ops and types after the filters, and the devices both have."""
    names_a = [d["name"] for d in pa["runtime"]["devices"]]
    names_b = [d["name"] for d in pb["runtime"]["devices"]]
    all_devs = names_a + [n for n in names_b if n not in names_a]
    check_names("device", devices, all_devs)
    devs = [d for d in all_devs if devices is None or d in devices]
    op_names = [c.op for c in CASES if ops is None or c.op in ops]
    type_names = [t for t in TYPES if types is None or t in types]
    both = [d for d in devs if d in names_a and d in names_b]
    return devs, op_names, type_names, both


def _speed_table(sa: Side, sb: Side, both: list[str], op_names: list[str], measure: bool,
                 rounds: int, threads: int, max_slowdown: float | None,
                 progress) -> tuple[list[dict], dict]:
    """The speed rows and their meta: the speed ops timed on the devices both sides have."""
    rounds_a = rounds_b = []
    speed_skipped = {"a": {}, "b": {}}
    if measure and rounds > 0:
        speed_ops = [c.op for c in CASES if c.speed and c.op in op_names]
        if both and speed_ops:
            rounds_a, rounds_b, speed_skipped = _speed(sa, sb, both, speed_ops, rounds, threads,
                                                       progress)
    speed_rows, speed_meta = _diff.speed(rounds_a, rounds_b, max_slowdown)
    speed_meta["skipped"] = speed_skipped
    speed_meta["cpu_threads"] = threads
    return speed_rows, speed_meta


def _backend_ops_report(sa: Side, sb: Side, pb: dict, mode: str | None, ops_filter: str | None,
                        progress) -> dict | None:
    """test-backend-ops run on both sides and joined, None unless both builds carry it."""
    from . import _backend_ops
    if not (_backend_ops.binary(sa) and _backend_ops.binary(sb)):
        return None
    local_gpu = [d for d in pb["runtime"]["devices"]
                 if d["type"] != "cpu" and d.get("registry") != "RPC"]
    mode = mode or ("test" if local_gpu else "support")
    ba, bb = [], []
    for s, acc in ((sa, ba), (sb, bb)):
        progress(f"test-backend-ops {mode} on {s.label}")
        acc += _backend_ops.run(s, mode, ops_filter, timeout=3600)
    return {"mode": mode, **_backend_ops.join(ba, bb)}


def compare(a: str, b: str | None = None, *, source: str | os.PathLike | None = None,
            backends: str | None = None, devices: list[str] | None = None,
            ops: list[str] | None = None, types: list[str] | None = None, speed: bool = True,
            rounds: int = 5, threads: int = 1, max_slowdown: float | None = None, backend_ops: str | None = None,
            backend_ops_filter: str | None = None, rpc_cross_check: bool = True,
            progress=None) -> dict:
    """Compare two builds; return the report (the JSON document, see docs/compare-schema.json).

    `devices`/`ops`/`types` narrow the op matrix (default: every device both sides have or
    either has, every op, every type); `backend_ops` is test-backend-ops' mode to run
    ("test", "support"; default: "test" with a non-CPU device, else "support") when both
    builds carry it."""
    progress = progress or Progress(quiet=True)
    check_names("op", ops, [c.op for c in CASES])
    check_names("type", types, list(TYPES))
    if b is None and source is None:
        raise CompareError("give two sides: A B, or A --source PATH")
    sa = resolve(a, backends=backends)
    sb = resolve(str(source), source=Path(source), backends=backends) if b is None \
        else resolve(b, backends=backends)
    pa, pb = _probe_both(sa, sb, progress)

    devs, op_names, type_names, both = _matrix_axes(pa, pb, devices, ops, types)
    cells = _cells(devs, op_names, type_names) if op_names else []
    res_a = run_cells(sa, cells, progress) if cells else []
    res_b = run_cells(sb, cells, progress) if cells else []
    speed_rows, speed_meta = _speed_table(sa, sb, both, op_names, speed, rounds, threads,
                                          max_slowdown, progress)

    runtime = _diff.runtime(pa["runtime"], pb["runtime"])
    runtime["rpc_cross"] = _cross(sa, sb, pa, pb, progress) if rpc_cross_check else None
    report = {
        "schema": SCHEMA_VERSION,
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "a": pa["side"], "b": pb["side"],
        "api": _diff.api(pa["api"], pb["api"]),
        "runtime": runtime,
        "ops": _diff.ops(cells, res_a, res_b),
        "rule_disagreements": _diff.rule_disagreements(cells, res_a, res_b,
                                                       (_short(sa), _short(sb))),
        "ops_meta": {"devices": devs, "ops": op_names, "types": type_names,
                     "cells": len(cells), "seed": "sha256 of 'op/type'",
                     "method": "each cell built with ggml's own calls, without ggml_py's rules "
                               "(the calls ggml_py makes for f32 operands, recorded and replayed "
                               "on the cell's types), run in a crash-isolated worker; ok: NMSE "
                               "against numpy within test-backend-ops' threshold; ggml_py's rule "
                               "for the cell asked separately (rule: allowed/refused)"},
        "speed": speed_rows, "speed_meta": speed_meta,
        "backend_ops": _backend_ops_report(sa, sb, pb, backend_ops, backend_ops_filter, progress),
    }
    report["verdict"] = _verdict.verdict(report)
    report["regressions"] = _verdict.regressions(report["verdict"])
    progress.done()
    return report


def load(path: Path) -> dict:
    """A report saved with --format json, its verdict computed where an older schema lacks it."""
    try:
        rep = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CompareError(f"{path}: not a compare report: {e}") from None
    if not isinstance(rep, dict) or "api" not in rep or "ops" not in rep:
        raise CompareError(f"{path}: not a compare report (no api/ops keys)")
    if "verdict" not in rep:
        rep["verdict"] = _verdict.verdict(rep)
        rep["regressions"] = _verdict.regressions(rep["verdict"])
    return rep


def render(report: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=1, sort_keys=False) + "\n"
    if fmt == "md":
        return _report.markdown(report)
    if fmt == "html":
        return _report.html_page(report)
    return "\n".join(_report.summary_lines(report)) + "\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):          # one line, not the usage block (see --help)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> _Parser:
    """The command line of ``python -m ggml_py compare``: sides, output, filters, speed."""
    p = _Parser(prog="python -m ggml_py compare",
                                description=__doc__.split("\n\n")[0].strip("`: "),
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", nargs="?", help="pinned release, build folder, or ggml tree")
    p.add_argument("b", nargs="?", help="pinned release, build folder, or ggml tree")
    p.add_argument("--from-json", type=Path, metavar="REPORT",
                   help="render a report saved with --format json again (no run): with "
                        "--format md/html/text")
    p.add_argument("--source", type=Path, metavar="PATH", help="a local ggml tree as side B")
    p.add_argument("--format", choices=("text", "json", "md", "html"), default="text")
    p.add_argument("-o", "--output", type=Path, help="write the report here (default stdout)")
    p.add_argument("--max-slowdown", type=float, metavar="X",
                   help="exit 1 when an op is more than X times slower on B (and beyond noise)")
    p.add_argument("--backends", metavar="LIST", help="backends of builds made for the "
                   "comparison, as build_ggml.py --backends (default: the platform's)")
    p.add_argument("--devices", metavar="LIST", help="comma list of device names for the op matrix")
    p.add_argument("--ops", metavar="LIST", help="comma list of ops (default: every op)")
    p.add_argument("--types", metavar="LIST", help=f"comma list of types (default: {','.join(TYPES)})")
    p.add_argument("--api-only", action="store_true",
                   help="API and runtime only: no op matrix, no speed table")
    p.add_argument("--rounds", type=int, default=5, help="speed rounds per side (0: no speed table)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of the speed table's CPU "
                   "and RPC backends (default 1: kernels, not thread scheduling, on a busy machine)")
    p.add_argument("--backend-ops", metavar="MODE", help="test-backend-ops mode when both builds "
                   "have it (--with-tests): test or support (default: test with a GPU, else support)")
    p.add_argument("--backend-ops-filter", metavar="OPS", help="test-backend-ops -o filter")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    return p


def parse_args(argv) -> argparse.Namespace:
    p = _parser()
    args = p.parse_args(argv)
    for name, value, low in (("--threads", args.threads, 1), ("--rounds", args.rounds, 0)):
        if value < low:
            p.error(f"{name} must be at least {low}, got {value}")
    if args.max_slowdown is not None and not args.max_slowdown > 0:
        p.error(f"--max-slowdown must be a positive factor, got {args.max_slowdown}")
    if args.backend_ops is not None and args.backend_ops not in ("test", "support", "perf"):
        p.error(f"--backend-ops must be test, support or perf, got {args.backend_ops!r}")
    if args.output is not None:
        parent = args.output.expanduser().resolve().parent
        if args.output.is_dir():
            p.error(f"-o {args.output}: is a folder; give a file name")
        if not parent.is_dir():
            p.error(f"-o {args.output}: the folder {parent} does not exist")
        if not os.access(parent, os.W_OK):
            p.error(f"-o {args.output}: the folder {parent} is not writable")
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]   # noqa: E731
    for name in ("devices", "ops", "types"):
        value = getattr(args, name)
        if value is not None and not split(value):
            p.error(f"--{name} is empty: give a comma list")
    if args.from_json is not None:
        if args.a is not None or args.source is not None:
            p.error("--from-json renders a saved report: give no sides")
        if not args.from_json.is_file():
            p.error(f"--from-json {args.from_json}: no such file")
        return args
    if args.a is None:
        p.error("give A and B (or A --source PATH), or --from-json REPORT")
    if args.b is None and args.source is None:
        p.error("give B, or --source PATH")
    if args.b is not None and args.source is not None:
        p.error("--source stands for B: give either B or --source")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()] if s else None  # noqa: E731
    if args.from_json is not None:
        try:
            rep = load(args.from_json)
        except CompareError as e:
            print(f"compare: error: {e}", file=sys.stderr)
            return 2
        text = render(rep, args.format)
        if args.output:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
        return 1 if rep["regressions"] else 0
    try:
        rep = compare(args.a, args.b, source=args.source, backends=args.backends,
                      devices=split(args.devices), ops=[] if args.api_only else split(args.ops),
                      types=split(args.types), rounds=0 if args.api_only else args.rounds, threads=args.threads, max_slowdown=args.max_slowdown,
                      backend_ops=args.backend_ops, backend_ops_filter=args.backend_ops_filter,
                      progress=Progress(quiet=args.quiet))
    except CompareError as e:
        print(f"compare: error: {e}", file=sys.stderr)
        return 2
    rep["command"] = ["python", "-m", "ggml_py", "compare",
                      *(sys.argv[1:] if argv is None else list(argv))]
    text = render(rep, args.format)
    if args.output:
        try:
            args.output.write_text(text)
        except OSError as e:
            print(f"compare: error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    if args.format != "text":
        sys.stderr.write("\n".join(_report.summary_lines(rep)) + "\n")
    return 1 if rep["regressions"] else 0
