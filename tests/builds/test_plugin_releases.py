"""pytest --ggml-releases: a failure's report survives a later test that kills the process,
every collected test runs once per release, an unknown release is a one-line usage error, and
ggml_release compares with tuples and strings. Real runs of pytest on real builds."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ggml_py as gg
from ggml_py.pytest_plugin import Release

ROOT = Path(__file__).resolve().parents[2]

FAIL_THEN_ABORT = '''
import os


def test_a_fails(ggml_release):
    assert ggml_release == (0, 99, 0), f"MARKER-{ggml_release}-assertion"


def test_b_aborts():
    os.abort()


def test_c_runs_after_the_abort(ggml_release):
    assert ggml_release == str(ggml_release)
'''


def _plugin_args() -> list[str]:
    from importlib.metadata import entry_points
    installed = any(ep.value == "ggml_py.pytest_plugin" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "ggml_py.pytest_plugin"]


def run_plugin(tmp_path: Path, releases: str, timeout: float = 600):
    (tmp_path / "test_x.py").write_text(FAIL_THEN_ABORT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("GGML_PY_BUILD", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", *_plugin_args(), "--ggml-releases", releases,
                           "test_x.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def check_two_releases(r, names: list[str], versions: list[str]) -> None:
    out = r.stdout
    assert r.returncode == 1, out[-3000:] + r.stderr[-2000:]
    fails = out[out.index("failures, per ggml release"):out.index("=== ggml releases ===")]
    summary = out[out.index("=== ggml releases ==="):]
    for name, version in zip(names, versions):
        # the failure's own report (its assertion message), though the next test killed
        # the process before pytest could print its summary
        block = fails[fails.index(f"ggml {name}: test_x.py::test_a_fails"):]
        assert f"MARKER-{version}-assertion" in block.split("\n_____")[0]
        assert f"ggml {name}: test_x.py::test_b_aborts" in fails
        # every test ran once: 1 passed (the one after the abort), 1 failed, 1 crashed
        line = next(ln for ln in summary.splitlines() if ln.startswith(f"ggml {name}:"))
        assert line.endswith("1 test(s) crashed the process (1 passed, 1 failed, 0 skipped)"), line
    assert summary.count("CRASHED test_x.py::test_b_aborts (SIGABRT)") == len(names)
    assert summary.count("FAILED test_x.py::test_a_fails") == len(names)
    assert "test_x.py::test_b_aborts" in fails and "SIGABRT" in fails
    assert "test_x.py\", line 10 in test_b_aborts" in fails     # the test's own frame


def test_a_failure_survives_a_later_crash_in_each_release(tmp_path):
    """Two names of the loaded build (its folder and its release): each runs all three tests
    in its own processes, the failure's message and the crash reported for each."""
    folder = str(gg.BUILD_DIR)
    release = gg.BUILD.get("release") or gg.ggml_version()
    r = run_plugin(tmp_path, f"{folder},{release}")
    check_two_releases(r, [folder, release], [gg.ggml_version()] * 2)


@pytest.mark.slow
def test_two_real_releases(tmp_path):
    """0.25.3 (built when missing) and the loaded build."""
    r = run_plugin(tmp_path, f"0.25.3,{gg.BUILD_DIR}", timeout=1800)
    if "cannot be built" in r.stdout:
        pytest.skip("0.25.3 cannot be built here: " + r.stdout[-500:])
    check_two_releases(r, ["0.25.3", str(gg.BUILD_DIR)], ["0.25.3", gg.ggml_version()])


@pytest.mark.parametrize("bad", ["0.99.0", "/no/such/build", "0.25.3,nonsense", ","])
def test_an_unknown_release_is_a_one_line_usage_error(tmp_path, bad):
    r = run_plugin(tmp_path, bad, timeout=120)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("ERROR: --ggml-releases:"), r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert "test_x.py" not in r.stdout          # nothing ran


def test_release_compares_with_tuples_and_strings():
    r = Release("0.25.3")
    assert r == (0, 25, 3) and r == "0.25.3" and r != (0, 26, 0) and r != "0.26.0"
    assert not (r != (0, 25, 3))
    assert r < (0, 26) and r >= "0.25.3" and r > (0, 25) and r <= "0.25.3"
    assert {r: 1}["0.25.3"] == 1                 # still a str for hashing
    assert r != 3 and r != None                  # noqa: E711
