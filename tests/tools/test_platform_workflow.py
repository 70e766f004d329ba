"""The macOS workflow (.github/workflows/macos.yml) cannot run here (no Mac): this keeps it
consistent with the README's quick start and with what issue 33 asks of it, by parsing it."""
import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "macos.yml"


def quick_start() -> list[str]:
    """The commands of the README's quick start (its first sh block)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README: no sh block in the quick start"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


def runs(job: dict) -> list[str]:
    """Every shell line the job runs, in order."""
    out = []
    for step in job["steps"]:
        out += [line.strip() for line in step.get("run", "").splitlines() if line.strip()]
    return out


def test_the_quick_start_is_what_the_readme_says():
    assert quick_start() == ["pip install -e '.[test]' && python -m ggml_py", "python -m pytest"]


@pytest.mark.parametrize("name", ["hosted", "apple-silicon"])
def test_each_job_installs_and_tests_as_the_readme_says(name):
    job = jobs()[name]
    lines = runs(job)
    install, suite = quick_start()
    assert install in lines                                  # the README's first command, verbatim
    suites = [line for line in lines if line.startswith(suite) and "GGML_PY_MUTATE" not in line]
    assert len(suites) == 1, suites
    args = shlex.split(suites[0])
    assert args[:3] == shlex.split(suite)                     # the README's second, plus:
    assert args[args.index("-m", 3) + 1] == "not slow"        # the non-slow subset,
    assert "--timeout" in args                                # a per-test timeout,
    i = lines.index(suites[0])
    assert "pip install pytest-timeout" in lines[:i]          # installed before,
    assert lines.index(install) < i                           # after the install
    assert job["env"]["GGML_METAL_DEVICES"] == "2"           # two virtual devices


def test_the_hosted_job_is_arm64_and_accepts_unsupported():
    job = jobs()["hosted"]
    # macos-14 and later hosted images are Apple Silicon (arm64); macos-13 is Intel
    m = re.fullmatch(r"macos-(\d+)(-xlarge)?", job["runs-on"])
    assert m and int(m.group(1)) >= 14, job["runs-on"]
    check = next(line for line in runs(job) if "matmul_check" in line)
    assert "'unsupported'" in check and "'ok'" in check


def test_the_self_hosted_job_is_labelled_and_opt_in():
    job = jobs()["apple-silicon"]
    assert {"self-hosted", "macOS", "ARM64", "apple-silicon"} <= set(job["runs-on"])
    assert "vars.GGML_PY_APPLE_SILICON_RUNNER" in job["if"]
    lines = runs(job)
    check = next(line for line in lines if "matmul_check" in line)
    assert "'unsupported'" not in check                       # a real GPU must compute it
    mutated = "\n".join(lines)
    for mode in ("record", "wait", "synchronize", "copy"):
        assert mode in mutated
    assert "tools.mutate_events" in mutated and "tests/accel/test_metal.py" in mutated


def test_the_mutation_modes_are_the_tools():
    from tools import mutate_events
    lines = "\n".join(runs(jobs()["apple-silicon"]))
    loop = re.search(r"for m in ([\w ]+); do", lines)
    assert loop and tuple(loop.group(1).split()) == mutate_events.MODES
