"""The mutation tools key their mutants on stable names, never on line numbers or line text
alone (issue 28).

tools/mutate.py (hand-named rules): each rule's text must be found exactly once inside its
named function, or the run would silently test nothing (the full run, which deletes each rule
and runs its tests, is `python tools/mutate.py`).

tools/mutants.py (mutants by class over the surface): every name is unique, every module that
calls ggml has mutants, every class is generated, and a sample applies to the live package
(the full run is `python tools/mutants.py`; docs/mutation.md)."""
import ast
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


mutate = _load("mutate")
mutants = _load("mutants")


@pytest.mark.parametrize("name", list(mutate.MUTATIONS))
def test_rule_text_is_found_once_in_its_function(name):
    path, qual, old, new, tests = mutate.MUTATIONS[name]
    src = (ROOT / path).read_text()
    assert mutate.mutated(src, qual, old, new) is not None, \
        f"{name}: {old!r} not found once in {path}:{qual}; update tools/mutate.py"
    assert old != new and tests


@pytest.fixture(scope="module")
def found():
    return mutants.discover()


def test_mutants_have_unique_stable_names(found):
    names = [m.name for m in found]
    assert len(names) == len(set(names))
    assert all(":" in m.qualname or m.qualname for m in found)
    assert not any(ch.isdigit() and ch == m.name.split(":")[1] for m in found for ch in m.name)
    assert {m.cls for m in found} == set(mutants.CLASSES)


def _calls_ggml_in_a_function(tree: ast.AST) -> bool:
    """A call `lib.ggml_*(...)` / `lib.gguf_*(...)` inside a function body (not in a docstring)."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "lib"
                        and node.func.attr.startswith(("ggml_", "gguf_"))):
                    return True
    return False


def test_every_module_that_calls_ggml_has_mutants(found):
    modules = {m.path for m in found}
    checked = 0
    for p in sorted((ROOT / "ggml_py").rglob("*.py")):
        rel = p.relative_to(ROOT)
        if "lib" in rel.parts[1:-1]:
            continue
        if _calls_ggml_in_a_function(ast.parse(p.read_text())):
            checked += 1
            assert str(rel) in modules, f"{rel} calls ggml but has no mutants"
    assert checked >= 10          # (the walk found the modules that call ggml)


def test_a_sample_of_mutants_applies_to_the_live_package(found):
    """Each applies in a forked child (the parent's package stays untouched)."""
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    sample = mutants.sample(found, 0, seed=28)[:20]
    for m in sample:
        pid = os.fork()
        if pid == 0:
            try:
                mutants.apply(m)
                os._exit(0)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"{m.name} does not apply"


@pytest.mark.parametrize("listing", ["must_kill.txt", "vulkan_must_kill.txt",
                                     "gpu/census_c.txt", "gpu/census_c2.txt"])
def test_must_kill_list_names_live_mutants(found, listing):
    """tools/must_kill.txt and tools/vulkan_must_kill.txt (CI runs them with --min-kill 100)
    and the GPU census lists name mutants that exist: a renamed function must rename its line
    there, not drop out of the check silently."""
    names = {m.name for m in found}
    listed = [ln.strip() for ln in (ROOT / "tools" / listing).read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    assert listed and not [n for n in listed if n not in names]


def test_a_module_run_with_dash_m_gets_its_mutant(tmp_path):
    """`python -m ggml_py.compare._worker` (compare's cell workers) runs the module as
    `__main__` through runpy, which an import hook never sees: the tool hands runpy the mutated
    code instead, and says so. Without that, every mutant of the worker survived untested."""
    import subprocess
    name = "ggml_py.compare._worker:ops_main:skip:ggml_abort#1"
    assert name in {m.name for m in mutants.discover()}
    mutants._write_site()
    note = tmp_path / "announce"
    env = dict(os.environ, GGML_PY_MUTANT=name, GGML_PY_MUTANT_ANNOUNCE=str(note),
               GGML_PY_MUTANT_TOOL=str(ROOT / "tools" / "mutants.py"),
               PYTHONPATH=os.pathsep.join([str(mutants.SITE), str(ROOT)]))
    r = subprocess.run([sys.executable, "-m", "ggml_py.compare._worker", "no-such-mode"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert "unknown mode 'no-such-mode'" in r.stderr       # the module ran, as __main__
    assert note.read_text().splitlines() == [mutants.APPLIED + name]


def test_names_run_in_the_order_of_their_file(found, tmp_path, capsys):
    """`--names` keeps its file's order (a census split between two machines takes one list
    from its two ends) and drops a name listed twice."""
    picked = [m.name for m in found[::97]][:5]
    assert len(picked) >= 3
    listed = list(reversed(picked)) + [picked[0]]
    f = tmp_path / "names.txt"
    f.write_text("# a comment\n" + "\n".join(listed) + "\n")
    assert mutants.main(["--list", "--names", str(f)]) == 0
    out = capsys.readouterr().out.split()
    assert out == list(reversed(picked))


def test_a_lazily_loaded_module_is_mutated_under_pytest(tmp_path):
    """`gg.rpc` loads on first use, through importlib, which no import statement sees; under
    pytest the assertion rewriter's finder also comes before the tool's. The mutant must still
    be in place when the test calls it (it was once applied at the next import statement,
    which came in pytest's summary, after every test had run unmutated)."""
    import subprocess
    name = "ggml_py.rpc:parse_endpoint:check:require#2"
    mutants._write_site()
    test = tmp_path / "test_lazy.py"
    test.write_text("import ggml_py as gg\n\n"
                    "def test_spaces_pass_the_mutant():\n"
                    "    assert gg.rpc.parse_endpoint('a b:1') == ('a b', 1)\n")
    env = dict(os.environ, GGML_PY_MUTANT=name,
               GGML_PY_MUTANT_TOOL=str(ROOT / "tools" / "mutants.py"),
               PYTHONPATH=os.pathsep.join([str(mutants.SITE), str(ROOT)]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                        "-p", "no:cacheprovider", str(test)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert "1 passed" in r.stdout, r.stdout[-2000:]


def test_a_function_run_while_the_package_loads_is_judged_mutated(tmp_path):
    """GGMLType.__new__ makes the type table while ggml_py._types loads; a mutant put into the
    function afterwards (as a forked child would) never reaches the table. The tool notes
    such functions while it imports the package and judges their mutants in a fresh process
    whose module runs mutated from its first line: the type traits are then wrong."""
    import subprocess
    name = "ggml_py._types:GGMLType.__new__:skip:ggml_blck_size#1"
    probe = ("import sys; sys.path.insert(0, 'tools'); import mutants; "
             "mutants.find_import_time(); "
             "m = next(x for x in mutants.discover() if x.name == %r); "
             "print(mutants._import_time(m), mutants._import_time(next(x for x in "
             "mutants.discover() if x.function == 'ggml_py._context:Context.alloc')))" % name)
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.stdout.split() == ["True", "False"], r.stdout + r.stderr[-1500:]
    mutants._write_site()
    env = dict(os.environ, GGML_PY_MUTANT=name,
               GGML_PY_MUTANT_TOOL=str(ROOT / "tools" / "mutants.py"),
               PYTHONPATH=os.pathsep.join([str(mutants.SITE), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", "import ggml_py as gg; print(gg.q4_0.block_size)"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() != "32", (r.stdout, r.stderr[-1500:])
    r = subprocess.run([sys.executable, "-c", "import ggml_py as gg; print(gg.q4_0.block_size)"],
                       cwd=tmp_path, env=dict(env, GGML_PY_MUTANT=""), capture_output=True,
                       text=True, timeout=120)
    assert r.stdout.strip() == "32", (r.stdout, r.stderr[-1500:])
