"""The two sides of a comparison: which build each one is, building what is missing, and the
child processes that load it (one process loads one build: ``GGML_PY_BUILD=<folder>``)."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent          # ggml_py/
CHECKOUT = PACKAGE.parent                                 # the source tree, when there is one
LIB_ROOT = PACKAGE / "lib"


class CompareError(Exception):
    """A side cannot be resolved, built or started; the message says what to do."""


@dataclass
class Side:
    label: str              # what the user typed: a release, a folder, a source tree
    folder: Path            # the build folder (may not exist yet)
    build_args: list[str] | None = None   # build_ggml.py arguments that make it, when missing

    @property
    def built(self) -> bool:
        return (self.folder / "build.json").exists()


def _build_command() -> list[str] | None:
    """How to run build_ggml: the checkout's script, or the build tooling an installed
    package ships (``python -m ggml_build``); None when neither is there."""
    if (CHECKOUT / "build_ggml.py").exists():
        return [sys.executable, str(CHECKOUT / "build_ggml.py")]
    try:
        import importlib.util
        if importlib.util.find_spec("ggml_build.__main__") is not None:
            return [sys.executable, "-m", "ggml_build"]
    except ImportError:
        pass
    return None


def _build_tools():
    if (CHECKOUT / "build_ggml.py").exists() and str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    try:
        from ggml_build import flags, pins
    except ImportError:
        return None
    return flags, pins


def resolve(spec: str, *, source: Path | None = None, backends: str | None = None) -> Side:
    """`_resolve`, with the build tooling's errors (an unknown backend, a folder that is no
    ggml tree) as CompareError: one line for the user, never a traceback."""
    try:
        return _resolve(spec, source=source, backends=backends)
    except CompareError:
        raise
    except Exception as e:
        from_tools = type(e).__module__.startswith("ggml_build")
        if not from_tools and not isinstance(e, (OSError, ValueError)):
            raise
        raise CompareError(f"{spec}: {e}") from None


def _resolve(spec: str, *, source: Path | None = None, backends: str | None = None) -> Side:
    """A side from a pinned release ("0.26.0"), a build folder (path or name under
    ggml_py/lib), or a ggml source tree (`source`, or a path holding include/ggml.h)."""
    tools = _build_tools()
    if backends is not None and tools is not None:     # checked even where nothing is built
        tools[0].parse_backends(backends, tools[0].Platform.detect())
    path = Path(spec).expanduser() if spec else None
    if source is None and path is not None and (path / "build.json").exists():
        return Side(spec, path.resolve())
    if source is None and (LIB_ROOT / spec / "build.json").exists():
        return Side(spec, LIB_ROOT / spec)
    if source is None and path is not None and (path / "include" / "ggml.h").exists():
        source = path
    if tools is None:
        raise CompareError(f"{spec!r} is not a build folder, and this installation has no "
                           "build_ggml.py to build it; pass a folder that holds build.json")
    flags, pins = tools
    be = flags.parse_backends(backends, flags.Platform.detect())
    be_arg = ["--backends", ",".join(be)]
    if source is not None:
        tree = pins.check_source(Path(source))
        name = flags.config_name(pins.tree_version(tree), be, source=str(tree))
        return Side(str(source), LIB_ROOT / name, ["--source", str(tree), *be_arg])
    _, known = pins.load_manifest()
    if spec not in known:
        order = sorted(known, key=pins._version_key, reverse=True)
        raise CompareError(f"{spec!r} is neither a pinned release ({', '.join(order)}), a build "
                           "folder, nor a ggml tree")
    name = flags.config_name(spec, be)
    return Side(spec, LIB_ROOT / name, ["--ggml", spec, *be_arg])


def build(side: Side, progress) -> None:
    """Run build_ggml.py for a side whose folder has no finished build."""
    if side.built:
        return
    if side.build_args is None:
        raise CompareError(f"{side.folder} holds no finished build")
    base = _build_command()
    if base is None:
        raise CompareError(f"cannot build {side.label}: this installation has neither "
                           "build_ggml.py nor the ggml_build package")
    cmd = [*base, *side.build_args, "--jobs", str(min(os.cpu_count() or 2, 8))]
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, cwd=CHECKOUT if base[1] != "-m" else None, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            progress(f"building {side.label} ({time.monotonic() - t0:.0f} s): "
                     f"{' '.join(side.build_args)}")
            time.sleep(1)
        log.seek(0)
        text = log.read()
    if proc.returncode != 0 or not side.built:
        raise CompareError(f"building {side.label} failed:\n{text[-3000:]}")


def child_env(side: Side) -> dict:
    env = dict(os.environ, GGML_PY_BUILD=str(side.folder), GGML_NO_BACKTRACE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def probe(side: Side, timeout: float = 300) -> dict:
    """API and runtime facts of one side (ggml_py.compare._probe in a child process)."""
    r = subprocess.run([sys.executable, "-m", "ggml_py.compare._probe"], env=child_env(side),
                       capture_output=True, text=True, timeout=timeout)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        raise CompareError(f"probing {side.label} ({side.folder}) failed (exit {r.returncode}):\n"
                           f"{r.stderr[-3000:]}")
    return json.loads(lines[-1])


def _reader(stream, q):
    for line in stream:
        q.put(line.rstrip("\n"))
    q.put(None)


def _tail(path: Path, n: int = 3) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-600:]


def _follow_worker(proc: subprocess.Popen, cells: list, side: Side, progress, results: list,
                   cell_timeout: float) -> tuple[int | None, bool, str | None, dict]:
    """Read a worker's lines into `results` until it ends or a cell outlasts `cell_timeout`."""
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
    current, timed_out, stage, rule = None, False, None, {}
    while True:
        try:
            line = q.get(timeout=cell_timeout)
        except queue.Empty:
            timed_out = True
            _kill(proc)
            break
        if line is None:
            break
        if line.startswith("stage "):
            stage = line[6:].split(" ")[0]
        elif line.startswith("rule "):
            rule = json.loads(line[5:])
        elif line.startswith("> "):
            current = int(line[2:])
            stage, rule = None, {}
            d, op, ty = cells[current]
            progress(f"ops {side.label}: {current + 1}/{len(cells)} {d} {op} {ty}")
        elif line.startswith("= "):
            i, _, payload = line[2:].partition(" ")
            results[int(i)] = json.loads(payload)
            current = None
    return current, timed_out, stage, rule


def run_cells(side: Side, cells: list, progress, cell_timeout: float = 120) -> list[dict]:
    """Run every cell in a worker of `side`; a cell that kills its worker is recorded as a
    crash (with the last lines the process wrote) and a new worker takes the next cell."""
    results: list[dict | None] = [None] * len(cells)
    with tempfile.TemporaryDirectory(prefix="ggml-compare-") as tmp:
        cells_path = Path(tmp) / "cells.json"
        cells_path.write_text(json.dumps(cells))
        start, restarts = 0, 0
        while start < len(cells):
            err_path = Path(tmp) / f"stderr-{restarts}.txt"
            with open(err_path, "w") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "ggml_py.compare._worker", "ops", str(cells_path),
                     str(start)], env=dict(child_env(side), GGML_PY_NO_CHECKED="1"), stdout=subprocess.PIPE, stderr=err,
                    text=True, start_new_session=True)
            current, timed_out, stage, rule = _follow_worker(proc, cells, side, progress,
                                                             results, cell_timeout)
            proc.wait()
            restarts += 1
            if current is not None:
                results[current] = {
                    "status": "timeout" if timed_out else "crash", "stage": stage,
                    "error": (f"no result within {cell_timeout:.0f} s (in {stage or 'setup'})"
                              if timed_out else f"{_signal_name(proc.returncode)} in "
                              f"{stage or 'setup'}: {_ggml_says(err_path)}")}
                if not timed_out:
                    results[current]["signal"] = _signal_name(proc.returncode)
                results[current].update(rule)
            missing = next((i for i in range(start, len(cells)) if results[i] is None), None)
            if missing is None:
                break
            if missing == start and current is None:
                # died before its first cell: every remaining cell fails the same way
                why = f"the worker exited with code {proc.returncode}: {_tail(err_path)}"
                for i in range(start, len(cells)):
                    results[i] = {"status": "error", "error": why}
                break
            start = missing
    return [r if r is not None else {"status": "error", "error": "no result"} for r in results]


def _ggml_says(path: Path) -> str:
    """ggml's message in a dead worker's stderr (the GGML_ASSERT / error line), else its tail."""
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    said = [ln for ln in lines if "GGML_ASSERT" in ln or "GGML_ABORT" in ln or ": error" in ln
            or "fatal" in ln.lower() or "abort" in ln.lower()]
    return " | ".join((said or lines)[-2:])[-500:]


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        proc.kill()


class SpeedWorker:
    """A persistent ``_worker speed`` process of one side: ``round()`` times every graph once."""

    def __init__(self, side: Side, spec: dict, tmp: Path):
        path = tmp / f"speed-{id(self)}.json"
        path.write_text(json.dumps(spec))
        self.err = tmp / f"speed-{id(self)}.err"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ggml_py.compare._worker", "speed", str(path)],
                env=child_env(side), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                text=True, start_new_session=True)
        self.side = side
        self.ready = self._read()
        self.skipped = self.ready.get("skipped", {})

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise CompareError(f"the speed worker of {self.side.label} died: {_tail(self.err)}")
            if line.startswith("{"):
                return json.loads(line)

    def round(self) -> dict:
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        return self._read()["times_us"]

    def close(self) -> None:
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            _kill(self.proc)


def _signal_name(code: int) -> str:
    import signal
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def rpc_cross(client: Side, server: Side, timeout: float = 120) -> dict:
    """A client of `client` against an RPC server of `server`, each its own build (see
    _rpc_cross): {"client", "server", "talks", "stage" (where it ended), "hello" or
    "hello_error" (ggml_py's view), "outcome" ("talks", "aborted", "error", "timeout"),
    "signal", "message" (ggml's last words on stderr)}."""
    short = lambda s: s.folder.name if os.sep in s.label else s.label   # noqa: E731
    res: dict = {"client": short(client), "server": short(server), "talks": False}
    try:
        r = subprocess.run([sys.executable, "-m", "ggml_py.compare._rpc_cross", str(server.folder)],
                           env=child_env(client), capture_output=True, text=True,
                           timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        stages = [ln[6:] for ln in out.splitlines() if ln.startswith("stage ")]
        res.update(outcome="timeout", stage=stages[-1] if stages else None,
                   message=f"no answer within {timeout:.0f} s")
        return res
    lines = r.stdout.splitlines()
    stages = [ln[6:] for ln in lines if ln.startswith("stage ")]
    res["stage"] = stages[-1] if stages else None
    doc = next((json.loads(ln) for ln in reversed(lines) if ln.startswith("{")), None)
    if doc is not None:
        res.update(doc)
        res["outcome"] = "talks" if doc.get("talks") else "error"
        if doc.get("error"):
            res["message"] = doc["error"]
        return res
    err = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
    said = [ln for ln in err if "GGML_ASSERT" in ln or "error" in ln.lower()
            or "mismatch" in ln.lower() or "failed" in ln.lower()]
    res.update(outcome="aborted" if r.returncode < 0 else "error",
               signal=_signal_name(r.returncode),
               message=" | ".join((said or err)[-3:])[-600:])
    for ln in lines:
        if ln.startswith("hello {"):
            res.update(json.loads(ln[6:]))
    return res
