"""Docs that run: every ```python block of the README alone, each in a fresh process (a
reader copies one block, not the page); the guide's blocks (docs/guide.md) in order, as one
program, the way its text reads; and the quick start is exactly what CI runs."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import child_env

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
GUIDE = (ROOT / "docs" / "guide.md").read_text()


def python_blocks(text: str = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.mark.parametrize("i", range(len(python_blocks())))
def test_every_readme_block_runs_alone(i, tmp_path):
    block = python_blocks()[i]
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env=child_env())
    assert r.returncode == 0, f"README python block {i} failed alone:\n{block}\n{r.stderr[-3000:]}"


def test_readme_is_short_and_has_blocks():
    assert len(python_blocks()) >= 3
    assert len(README.splitlines()) < 200         # detail lives in docs/


def test_every_guide_block_runs_in_order(tmp_path):
    blocks = python_blocks(GUIDE)
    assert len(blocks) >= 5
    marks = [f"print('--- block {i} done')\n" for i in range(len(blocks))]
    program = "".join(b + m for b, m in zip(blocks, marks))
    (tmp_path / "guide.py").write_text(program)
    env = child_env()   # installed or not
    r = subprocess.run([sys.executable, str(tmp_path / "guide.py")], capture_output=True,
                       text=True, timeout=600, cwd=tmp_path, env=env)
    done = re.findall(r"--- block (\d+) done", r.stdout)
    failed_at = len(done)
    assert r.returncode == 0, (f"guide python block {failed_at} failed:\n"
                               f"{blocks[failed_at] if failed_at < len(blocks) else ''}\n"
                               f"{r.stderr[-3000:]}")
    assert len(done) == len(blocks)


def test_first_example_prints_a_matmul_equal_to_numpy():
    block = python_blocks()[0]
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "CPU" in r.stdout


def test_quick_start_is_what_ci_runs():
    quick = re.search(r"## Quick start\n.*?```sh\n(.*?)```", README, re.S).group(1)
    lines = quick.strip().splitlines()
    assert len(lines) == 2
    ci = (ROOT / ".ci" / "run").read_text()
    for line in lines:
        assert line in ci
