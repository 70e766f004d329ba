"""The bad-input corpus (tests/support/corpus.py), each case run so that a crash fails that case
alone and names it: cases go in batches to child processes; when a child dies, the case it
was running is reported as the crash and the rest continue in a fresh child. After every
refused case the child computes a small graph on the CPU and on RPC, so a refusal that left
the process or a backend broken fails too."""
import subprocess
import sys

import pytest

from support import ROOT, SUPPORT, child_env, corpus

CASES = corpus.expanded()
BATCHES = 4


def _run(names: list[str]) -> dict[str, str]:
    """Results of `names`, restarting the child after each crash."""
    results: dict[str, str] = {}
    todo = list(names)
    while todo:
        proc = subprocess.run([sys.executable, str(SUPPORT / "corpus.py")], input="\n".join(todo) + "\n",
                              capture_output=True, text=True, timeout=600, cwd=ROOT,
                              env=child_env())
        lines = [ln for ln in proc.stdout.splitlines() if "\t" in ln]
        for ln in lines:
            status, name = ln.split("\t", 1)
            results[name] = status
        done = len(lines)
        if done == len(todo):
            break
        if "READY" not in proc.stdout:
            raise RuntimeError(f"the corpus environment failed:\n{proc.stderr[-3000:]}")
        crashed = todo[done]
        results[crashed] = f"CRASH (exit {proc.returncode}): {proc.stderr[-500:]}"
        todo = todo[done + 1:]
    return results


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    names = list(CASES)
    out: dict[str, str] = {}
    size = -(-len(names) // BATCHES)
    for i in range(0, len(names), size):
        out.update(_run(names[i:i + size]))
    return out


def test_the_corpus_is_large():
    assert len(corpus.CASES) >= 300 and len(CASES) >= 500


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_cleanly(results, name):
    got = results.get(name) or ""
    if got.startswith("SKIP "):
        pytest.skip(got[5:])
    assert got == "OK", got
