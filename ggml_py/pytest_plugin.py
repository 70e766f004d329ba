"""pytest plugin: run a test suite once per ggml release, each release in its own process.

    pytest --ggml-releases 0.25.3,0.26.0          # pinned releases (built when missing)
    pytest --ggml-releases ggml-0.20.2-cpu-rpc,/path/to/build   # or build folders

One process loads one build, so the plugin does not run tests itself: it starts
``python -m pytest`` with the same arguments once per release (``GGML_PY_BUILD`` set to that
release's build folder), streams each run's output under a header, and ends with one line per
release. A test that kills its process (ggml aborts on a bad input, an RPC server dies under
the client) is reported as a failure of that test on that release, and a new process goes on
with the tests that had not run yet; the exit status is the worst of the releases'.

In the tests, the ``ggml_release`` fixture names the release of the loaded build::

    def test_events(ggml_release):
        if ggml_release < (0, 23, 0):
            pytest.skip("RPC events arrived in 0.23.0")
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

RELEASE_ENV = "GGML_PY_RELEASE"         # set in each per-release process
STATE_ENV = "GGML_PY_PYTEST_STATE"      # file the child appends started/finished test ids to
SKIP_ENV = "GGML_PY_PYTEST_SKIP"        # file of test ids a restarted child leaves out


class Release(str):
    """A release string that compares as a version: ``ggml_release >= (0, 23)``,
    ``ggml_release == (0, 25, 3)``, ``ggml_release == "0.25.3"``."""

    @property
    def version(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.split(".")[:3] if p.isdigit())

    def _cmp(self, other):
        if isinstance(other, str):
            other = Release(other).version
        return self.version, tuple(other)

    def __eq__(self, other):
        if isinstance(other, tuple):
            return self.version == other
        if isinstance(other, str):
            return str.__eq__(self, other) or (bool(Release(other).version)
                                               and self.version == Release(other).version)
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __lt__(self, other): a, b = self._cmp(other); return a < b          # noqa: E702
    def __le__(self, other): a, b = self._cmp(other); return a <= b         # noqa: E702
    def __gt__(self, other): a, b = self._cmp(other); return a > b          # noqa: E702
    def __ge__(self, other): a, b = self._cmp(other); return a >= b         # noqa: E702
    __hash__ = str.__hash__


def pytest_addoption(parser):
    group = parser.getgroup("ggml_py")
    group.addoption("--ggml-releases", metavar="LIST", default=None,
                    help="comma list of ggml releases (or build folders): run the tests once "
                         "per release, each in its own process, and report per release")


@pytest.fixture(scope="session")
def ggml_release() -> Release:
    """The ggml release of the build this test process loaded (e.g. "0.25.3")."""
    import ggml_py
    return Release(ggml_py.ggml_version())


# -- in a per-release child: remember which test runs, leave out what already ran ----------
def _append(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def pytest_runtest_logstart(nodeid, location):
    path = os.environ.get(STATE_ENV)
    if path:
        _append(path, {"start": nodeid})


def pytest_runtest_logfinish(nodeid, location):
    path = os.environ.get(STATE_ENV)
    if path:
        _append(path, {"done": nodeid})


def pytest_runtest_logreport(report):
    path = os.environ.get(STATE_ENV)
    if path and (report.failed or (report.when == "call" and report.passed)
                 or (report.skipped and report.when != "teardown")):
        outcome = "failed" if report.failed else report.outcome
        rec = {"outcome": outcome, "id": report.nodeid}
        if report.failed:
            # the report itself (assertion, traceback): kept in the file, so that a later
            # test that kills the process cannot take it with the process's summary
            rec["when"] = report.when
            rec["longrepr"] = report.longreprtext
        _append(path, rec)


def pytest_collection_modifyitems(session, config, items):
    path = os.environ.get(SKIP_ENV)
    if not path or not Path(path).exists():
        return
    skip = set(Path(path).read_text().splitlines())
    keep = [it for it in items if it.nodeid not in skip]
    gone = [it for it in items if it.nodeid in skip]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


# -- in the process the user started: one child per release ----------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    releases = config.getoption("ggml_releases")
    if not releases or os.environ.get(RELEASE_ENV):
        return None
    names = [r.strip() for r in releases.split(",") if r.strip()]
    try:
        sides = resolve_releases(names)
    except pytest.UsageError as e:
        # pytest's usage error: one line, exit status 4, before anything ran
        sys.stderr.write(f"ERROR: --ggml-releases: {e}\n")
        return pytest.ExitCode.USAGE_ERROR
    return run_releases(names, _args_without_option(config.invocation_params.args),
                        Path(config.invocation_params.dir), sides=sides)


def resolve_releases(names: list[str]) -> dict:
    """{name: Side} for every release or build folder named; pytest.UsageError (one line)
    for an empty list or a name that is neither a pinned release nor a build folder."""
    from .compare._sides import CompareError, resolve
    if not names:
        raise pytest.UsageError("give a comma list of pinned releases or build folders")
    out = {}
    for n in names:
        try:
            out[n] = resolve(n)
        except CompareError as e:
            raise pytest.UsageError(str(e).splitlines()[0]) from None
        except Exception as e:          # e.g. build tooling of another layout: still one line
            raise pytest.UsageError(f"{n!r}: {type(e).__name__}: {e}") from None
    return out


def _args_without_option(args) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--ggml-releases":
            skip = True
            continue
        if a.startswith("--ggml-releases="):
            continue
        out.append(a)
    return out


def _folder(release: str, say, side=None) -> Path:
    from .compare._sides import CompareError, build, resolve
    side = side or resolve(release)
    if not side.built:
        say(f"building ggml {release} ...")
        try:
            build(side, lambda msg: None)
        except CompareError as e:
            raise pytest.UsageError(str(e)) from None
    return side.folder


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def run_releases(releases: list[str], args: list[str], cwd: Path, out=None,
                 sides: dict | None = None) -> int:
    """Run ``python -m pytest ARGS`` once per release; return the worst exit status."""
    out = out or sys.stdout
    say = lambda msg: (out.write(msg + "\n"), out.flush())   # noqa: E731
    sides = sides or {}
    results = []
    for rel in releases:
        try:
            folder = _folder(rel, say, sides.get(rel))
        except pytest.UsageError as e:
            msg = str(e).splitlines()
            say(f"ggml {rel}: cannot be built: {msg[0] if msg else e}")
            results.append((rel, 4, "build failed", [], {}))
            continue
        results.append((rel, *_run_one(rel, folder, args, cwd, say)))
    failures = [(rel, n, rep) for rel, *_, reports in results for n, rep in reports.items()]
    if failures:
        say("\n" + "=" * 25 + " failures, per ggml release " + "=" * 25)
        for rel, nodeid, rep in failures:
            say(f"{'_' * 10} ggml {rel}: {nodeid} {'_' * 10}")
            say(rep.rstrip())
    say("\n" + "=" * 30 + " ggml releases " + "=" * 30)
    worst = 0
    for rel, code, summary, crashed, _ in results:
        say(f"ggml {rel}: {summary}")
        for nodeid, why in crashed:
            say(f"    FAILED {nodeid}" if why == "failed" else f"    CRASHED {nodeid} ({why})")
        worst = max(worst, code)
    return worst


def _run_one(release: str, folder: Path, args: list[str], cwd: Path, say):
    crashed: list[tuple[str, str]] = []
    last_words: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ggml-releases-") as tmp:
        state, skip = Path(tmp) / "state.jsonl", Path(tmp) / "skip.txt"
        env = dict(os.environ, GGML_PY_BUILD=str(folder), **{RELEASE_ENV: release,
                   STATE_ENV: str(state), SKIP_ENV: str(skip)})
        code, runs = 0, 0
        while True:
            runs += 1
            say(f"\n{'=' * 20} ggml {release} ({folder.name})"
                + (f", run {runs} after a crash" if runs > 1 else "") + f" {'=' * 20}")
            proc, tail = _tee([sys.executable, "-m", "pytest", *args], cwd, env, say)
            started, done = _read_state(state)
            running = [n for n in started if n not in done and n not in dict(crashed)]
            rc = proc.returncode
            if rc == 5 and runs > 1:     # a run after a crash found nothing left to run
                rc = 0
            if rc >= 0 and not running:
                code = max(code, rc)
                break
            # the process died inside a test: report it, go on without what already ran
            if not running:
                code = max(code, 3)
                crashed.append(("(outside any test)", _signal_name(proc.returncode)))
                break
            crashed.append((running[-1], _signal_name(proc.returncode)))
            last_words[running[-1]] = (f"the test process died ({_signal_name(proc.returncode)}) "
                                       "in this test; its last words:\n" + _last_words(tail))
            code = max(code, 1)
            if runs > 1000:            # a collection that differs from run to run
                break
            skip.write_text("\n".join(started) + "\n")
        n_crash = len(crashed)
        summary = ("passed" if code == 0 else
                   "no tests ran" if code == 5 else f"failed (exit {code})")
        if n_crash:
            summary += f", {n_crash} test(s) crashed the process"
        outcomes = _outcomes(state)
        counts = {k: sum(v == k for v in outcomes.values()) for k in ("passed", "failed", "skipped")}
        summary += " (" + ", ".join(f"{v} {k}" for k, v in counts.items()) + ")"
        crashed += [(n, "failed") for n, v in outcomes.items() if v == "failed"]
        reports = {**_failure_reports(state), **last_words}
        # exit status 5 (nothing collected) in one release is no failure of the matrix
        return (0 if code == 5 else code), summary, crashed, reports


def _last_words(tail: list[str]) -> str:
    """What a dead test process said last: the lines before faulthandler's dump, and the
    dump's innermost frame (the test's own line)."""
    i = next((k for k, ln in enumerate(tail) if ln.startswith("Current thread")), None)
    if i is None:
        return "\n".join(tail[-15:])
    frames = [ln for ln in tail[i + 1:] if ln.strip().startswith("File ")]
    return "\n".join(tail[max(0, i - 12):i] + frames[:1])


def _tee(cmd: list[str], cwd: Path, env: dict, say, keep: int = 200):
    """Run `cmd`, its output (stdout and stderr) passed through as it comes; return the
    finished process and its last `keep` lines."""
    import collections
    tail: collections.deque = collections.deque(maxlen=keep)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        say(line)
    proc.wait()
    return proc, list(tail)


def _failure_reports(path: Path) -> dict[str, str]:
    """{test id: pytest's report of its failure (assertion, traceback)} over every run."""
    out: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("outcome") == "failed" and rec.get("longrepr") is not None:
                head = f"(failed in {rec.get('when')})\n" if rec.get("when") != "call" else ""
                out[rec["id"]] = out.get(rec["id"], "") + head + rec["longrepr"] + "\n"
    return out


def _read_state(path: Path) -> tuple[list[str], set[str]]:
    started, done = [], set()
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "start" in rec:
                started.append(rec["start"])
            elif "done" in rec:
                done.add(rec["done"])
    return started, done


def _outcomes(path: Path) -> dict[str, str]:
    """{test id: passed/failed/skipped} over every run of one release (failed wins)."""
    out: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "outcome" in rec and out.get(rec["id"]) != "failed":
                out[rec["id"]] = rec["outcome"]
    return out
