"""The hypothesis generator of tests/support/generated.py (op x layout x type x device, checked against
numpy or a clean refusal), run in a child process: a crash fails this test, and the last case
the child printed names it. Longer runs: ``python tests/support/generated.py --examples 20000``."""
import json
import subprocess
import sys

import pytest
from support import ROOT, SUPPORT, child_env



def _run(examples: int, seed: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SUPPORT / "generated.py"), "--examples", str(examples),
                           "--seed", str(seed)], capture_output=True, text=True, timeout=900,
                          cwd=ROOT, env=child_env())


def _verdict(r: subprocess.CompletedProcess) -> dict:
    cases = [ln for ln in r.stdout.splitlines() if ln.startswith("CASE ")]
    assert r.returncode == 0, (f"exit {r.returncode}; last case: {cases[-1] if cases else None}\n"
                               f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    counts = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("COUNTS ")][-1][7:])
    assert counts["ok"] > counts["refused"] > 0
    return counts


def test_generated_cases_match_numpy_or_are_refused():
    _verdict(_run(200, 0))


@pytest.mark.slow
def test_generated_cases_long_run():
    _verdict(_run(5000, 1))
