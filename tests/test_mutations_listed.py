"""tools/mutate.py names each validation rule by its text: every text must still be found
exactly once, or the mutation run silently tests nothing (the full run, which deletes each
rule and runs its tests, is `python tools/mutate.py`)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("mutate", ROOT / "tools" / "mutate.py")
mutate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutate)


@pytest.mark.parametrize("name", list(mutate.MUTATIONS))
def test_rule_text_is_found_once(name):
    path, old, new, tests = mutate.MUTATIONS[name]
    assert (ROOT / path).read_text().count(old) == 1, f"{name}: update tools/mutate.py"
    assert old != new and tests
