"""The package's imports run one way: a walk of every ``import`` in ggml_py/**.py (the source,
not the running interpreter) finds no circle among ggml_py's modules once the imports made at
module level and under ``if TYPE_CHECKING:`` are counted. Imports inside functions (made on first
use) are in the graph too and may point up; the layers they may cross are import-linter's
contract in pyproject.toml (``lint-imports``, run by .ci/run)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "ggml_py"

MODULE, TYPE_CHECKING, FUNCTION = "module", "type-checking", "function"


def module_name(path: Path, root: Path = PKG) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a module with where it runs: at module level, under
    ``if TYPE_CHECKING:`` (read by type checkers only) or inside a function."""
    out: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def walk(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, kind))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                walk(child, FUNCTION)
            elif isinstance(child, ast.If) and kind == MODULE and _is_type_checking(child.test):
                for stmt in child.body:
                    walk(ast.Module(body=[stmt], type_ignores=[]), TYPE_CHECKING)
                for stmt in child.orelse:
                    walk(ast.Module(body=[stmt], type_ignores=[]), MODULE)
            else:
                walk(child, kind)
    walk(tree, MODULE)
    return out


def import_graph(root: Path = PKG) -> dict[str, dict[str, set[str]]]:
    """{module: {imported ggml_py module: {kinds}}} for every module under `root`. Importing
    ``ggml_py.ops.shape`` runs ``ggml_py/ops/__init__.py`` first, so it counts as importing
    ``ggml_py.ops`` too (the top package's lazy face excepted: it imports nothing at first)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    graph: dict[str, dict[str, set[str]]] = {m: {} for m in files}
    for mod, path in files.items():
        base = mod if mod in packages else mod.rpartition(".")[0]
        for node, kind in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                pkg = base
                for _ in range(node.level - 1 if node.level else 0):
                    pkg = pkg.rpartition(".")[0]
                src = (f"{pkg}.{node.module}" if node.module else pkg) if node.level else (
                    node.module or "")
                subs = [f"{src}.{a.name}" for a in node.names]
                # `from . import x`: the module x only; `from .m import name`: the module m
                targets = subs if all(t in files for t in subs) else [src] + subs
            for t in targets:
                while t and t not in files:         # a name from a module: the module
                    t = t.rpartition(".")[0]
                if not t or t == mod:
                    continue
                # the packages above the target run first, unless they hold the importing
                # module (then they are running already) or are the top one
                parts = t.split(".")
                for i in range(2, len(parts) + 1):
                    name = ".".join(parts[:i])
                    if name in files and name != mod and not mod.startswith(name + "."):
                        graph[mod].setdefault(name, set()).add(kind)
    return graph


def find_cycle(graph: dict[str, dict[str, set[str]]], kinds: set[str]) -> list[str] | None:
    """A circle of imports of the given kinds, as [a, b, ..., a]; None when there is none."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        color[m] = GREY
        stack.append(m)
        for t, ks in sorted(graph[m].items()):
            if not ks & kinds:
                continue
            if color[t] == GREY:
                return stack[stack.index(t):] + [t]
            if color[t] == WHITE:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(graph):
        if color[m] == WHITE:
            found = visit(m)
            if found:
                return found
    return None


def test_the_walk_sees_every_kind_of_import():
    """The graph holds the imports made at module level, under TYPE_CHECKING and inside
    functions (a walk that missed one kind would find no circle in it)."""
    g = import_graph()
    kinds = {k for edges in g.values() for ks in edges.values() for k in ks}
    assert kinds == {MODULE, TYPE_CHECKING, FUNCTION}
    assert "ggml_py._loader" in g["ggml_py._types"]
    assert MODULE in g["ggml_py._tensor"]["ggml_py.ops"]


def test_no_import_circle():
    """Module-level and TYPE_CHECKING imports among ggml_py's modules form no circle: a module
    needing a name from above it for an annotation asks for a Protocol from below instead."""
    cycle = find_cycle(import_graph(), {MODULE, TYPE_CHECKING})
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_layers_contract_holds():
    """import-linter's layers contract (pyproject.toml), the check `lint-imports` makes in CI:
    no module imports one of a floor above its own, inside functions and under TYPE_CHECKING
    included, but for the imports the contract lists with their reason."""
    pytest.importorskip("importlinter")
    code = ("import sys; from importlinter.cli import lint_imports_command; "
            "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=PKG.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_a_circle_is_found(tmp_path):
    """The check can fail: two modules importing each other, one of them only for a type."""
    pkg = tmp_path / "ggml_py"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from .a import X\n")
    g = import_graph(pkg)
    assert find_cycle(g, {MODULE, TYPE_CHECKING}) == ["ggml_py.a", "ggml_py.b", "ggml_py.a"]
    assert find_cycle(g, {MODULE}) is None


@pytest.mark.parametrize("src", ["def f():\n    from . import a\n",
                                 "class C:\n    def f(self):\n        import ggml_py.a\n"])
def test_imports_in_functions_are_no_circle(tmp_path, src):
    pkg = tmp_path / "ggml_py"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text(src)
    g = import_graph(pkg)
    assert g["ggml_py.b"]["ggml_py.a"] == {FUNCTION}
    assert find_cycle(g, {MODULE, TYPE_CHECKING}) is None


def _feature_gates(tree: ast.AST) -> list[tuple[int, str]]:
    """`hasattr(lib, "name")` and `getattr(lib, "name", None)`: asking whether the release has a
    named function or constant (a lookup of a name built at run time is dispatch, and a
    constant read with a default value is a value, not a gate)."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2):
            continue
        obj, name = node.args[0], node.args[1]
        if not (isinstance(obj, ast.Name) and obj.id == "lib" and isinstance(name, ast.Constant)):
            continue
        default = node.args[2] if len(node.args) > 2 else None
        if node.func.id == "hasattr" or (isinstance(default, ast.Constant) and default.value is None):
            found.append((node.lineno, name.value))
    return found


def test_feature_gates_live_in_the_features_table():
    """What a release offers is read in one place (ggml_py/_features.py, and the loader that
    fills `lib`); every other module asks that table."""
    assert _feature_gates(ast.parse("hasattr(lib, 'ggml_x')\ngetattr(lib, 'Y', None)\n"
                                    "getattr(lib, f'ggml_{n}')\ngetattr(lib, 'Z', 16)\n")) \
        == [(1, "ggml_x"), (2, "Y")]
    where = {}
    for path in sorted(PKG.rglob("*.py")):
        if "lib" in path.relative_to(PKG).parts[:-1] or path.name in ("_features.py", "_loader.py"):
            continue
        for line, name in _feature_gates(ast.parse(path.read_text())):
            where[f"{module_name(path)}:{line}"] = name
    assert not where, f"ask ggml_py._features instead: {where}"
