"""Docs that run: every ```python block of the README, in order, as one program in a fresh
process (each block may use what an earlier one defined, as a reader would type them), and the
quick start is exactly what CI runs."""
import re
import subprocess
import sys
from pathlib import Path
from conftest import child_env

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def test_every_python_block_runs_in_order(tmp_path):
    blocks = python_blocks()
    assert len(blocks) >= 5
    marks = [f"print('--- block {i} done')\n" for i in range(len(blocks))]
    program = "".join(b + m for b, m in zip(blocks, marks))
    (tmp_path / "readme.py").write_text(program)
    env = child_env()   # installed or not
    r = subprocess.run([sys.executable, str(tmp_path / "readme.py")], capture_output=True,
                       text=True, timeout=600, cwd=tmp_path, env=env)
    done = re.findall(r"--- block (\d+) done", r.stdout)
    failed_at = len(done)
    assert r.returncode == 0, (f"README python block {failed_at} failed:\n"
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
