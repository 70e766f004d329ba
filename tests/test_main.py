"""The main job and the README's first example."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_python_m_ggml_py_lists_devices_and_checks_matmul():
    r = subprocess.run([sys.executable, "-m", "ggml_py"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ggml 0." in r.stdout and "CPU" in r.stdout and "buffer type CPU" in r.stdout
    assert re.search(r"CPU\s+ok", r.stdout)


def test_readme_first_example_runs():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "CPU" in r.stdout


def test_readme_quick_start_is_what_ci_runs():
    text = (ROOT / "README.md").read_text()
    quick = re.search(r"## Quick start\n.*?```sh\n(.*?)```", text, re.S).group(1).strip().splitlines()
    assert len(quick) == 2
    ci = (ROOT / ".ci" / "run").read_text()
    for line in quick:
        assert line in ci
