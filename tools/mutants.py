"""Mutants by class over every function of ggml_py that reaches ggml, keyed on stable names.

    python tools/mutants.py --list                 # every mutant, by its stable name
    python tools/mutants.py                        # map tests, then run every mutant
    python tools/mutants.py --sample 120 --seed 1  # a seeded sample reaching every function
    python tools/mutants.py -k _transfer --min-kill 95

The mutants are generated from the code's structure (its AST), never from line numbers or line
text, so a refactor moves them along with the code. Three classes, over each function or
method (top-level ``def`` or a ``def`` in a top-level class; nested defs belong to their outer
function) of ``ggml_py/**.py``:

``skip``     a call into the cffi ``lib`` (``lib.ggml_*``, ``lib.gguf_*``, the ``ggml_py_*``
             helpers of ggml_build/helpers.c, and names bound to them: ``_COPY = lib.ggml_py_copy``)
             does nothing: its arguments are still evaluated, its result is the neutral value
             of its C type (``None`` for void, ``0`` for an int/enum/bool status or size,
             ``0.0`` for a float, and for a pointer the argument of the same C type when there
             is one, "the input returned unchanged", else ``NULL``);
``check``    a ``require(...)``, ``rows(...)``/``contiguous(...)``/``blas_rows(...)`` statement
             is removed, and ``check(x, ...)``/``check_status(x, ...)``/``check_ptr(x, ...)``
             becomes ``x``;
``swap``     two arguments of a C call whose parameters have the same C type (src/dst,
             offset/size, the two backends of a copy) change places (adjacent pairs of each
             type; textually equal arguments are not swapped).

A mutant's name is ``module:qualname:class:callee#k`` (``k`` counts that callee's sites in the
function, in source order; a property setter's qualname ends in ``.setter``).

Running: the tests are first mapped to the functions they call (one run of the selected tests
under a profile hook, in a child process; cached in .mutants/ by the hash of ggml_py/ and
tests/). A fork server then imports ggml_py and the test modules once (it computes nothing, so
no thread pool exists to fork), and forks one child per mutant: the child compiles the mutated
function and puts its code into the live function object (``f.__code__``: every reference to
the function, bound methods and tables included, sees the mutant), then runs pytest on the
tests that call that function, fastest first, ``-x``. Each child is its own process group
with a timeout, so a crash or a hang is that mutant's result alone. Killed = the tests failed
or the process died (a removed rule let ggml abort: the rule is observable); survived = every
selected test passed; timed out = counted apart; no tests = no selected test calls the
function (a survivor by definition, listed as such).

Tests that run ggml_py in another process (the CLI, the compare workers, the build tests)
cannot see a mutant applied in the test process: they are not mapped, and the functions only
they reach report "no tests".
"""
from __future__ import annotations

import argparse
import ast
import builtins
import hashlib
import importlib.abc
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "ggml_py"
CACHE = ROOT / ".mutants"
CLASSES = ("skip", "check", "swap")
# the test files the map runs (the non-slow suite less what only builds, installs or drives
# the tool itself); -m "not slow" is added
DEFAULT_TESTS = ["tests"]
EXCLUDE_TESTS = ("tools/test_mutations_listed.py", "builds/test_install.py", "builds/test_build_cli.py",
                 "builds/test_build_flags.py", "builds/test_releases.py", "tools/test_readme.py",
                 "tools/test_notebook.py")
REFUSAL_TESTS = {"test_mutants_killed.py", "test_bad_input.py", "test_generated.py", "test_fuzz.py", "test_checked.py",
                 "test_ops.py", "test_gguf.py", "test_status.py"}
CHECK_STMT = {"require", "rows", "contiguous", "blas_rows"}
CHECK_WRAP = {"check", "check_status", "check_ptr"}


@dataclass
class Mutant:
    name: str          # module:qualname:class:callee#k
    module: str        # ggml_py._transfer
    qualname: str      # Context.from_numpy, blocking_set, Tensor.data.setter
    cls: str           # skip / check / swap
    site: str          # callee#k (swap: callee#k:i<->j)
    path: str          # ggml_py/_transfer.py

    @property
    def function(self) -> str:
        return f"{self.module}:{self.qualname}"


# ---------------------------------------------------------------------------- discovery
def _ctypes() -> dict[str, Any]:
    """C name -> cffi function type of every function the lib exposes (None when not a
    function)."""
    sys.path.insert(0, str(ROOT))
    from ggml_py._loader import ffi, lib
    out: dict[str, Any] = {}
    for n in dir(lib):
        if n.startswith(("ggml_", "gguf_")):
            try:
                t = ffi.typeof(getattr(lib, n))
            except Exception:
                continue
            if t.kind == "function":
                out[n] = t
    return out


def _lib_name(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """`lib.ggml_x` -> ggml_x; a name bound to one -> its C name."""
    if isinstance(node, ast.Attribute) and (
            (isinstance(node.value, ast.Name) and node.value.id in ("lib", "_lib"))
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "lib")):   # gg.lib.x
        return node.attr if node.attr.startswith(("ggml_", "gguf_")) else None
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    return None


def _alias_target(value: ast.expr | None) -> str | None:
    """`lib.X`, `lib.X if HELPERS else None` -> X."""
    if isinstance(value, ast.IfExp):
        value = value.body
    if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
            and value.value.id == "lib" and value.attr.startswith(("ggml_", "gguf_"))):
        return value.attr
    return None


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            t = _alias_target(node.value)
            if t:
                out[node.targets[0].id] = t
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            t = _alias_target(node.value)
            if t:
                out[node.target.id] = t
    return out


def _local_aliases(fn: ast.AST) -> dict[str, str]:
    out = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            t = _alias_target(node.value)
            if t:
                out[node.targets[0].id] = t
    return out


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, str | None]]:
    """(qualname, def, enclosing class name) of top-level functions and methods."""
    out: list[tuple[str, Any, str | None]] = []

    def suffix(fn: Any) -> str:
        for d in fn.decorator_list:
            if isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter"):
                return "." + d.attr
        return ""

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.name + suffix(node), node, None))
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append((f"{node.name}.{sub.name}{suffix(sub)}", sub, node.name))
    return out


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _sites(fn: Any, aliases: dict[str, str], ctypes: dict[str, Any]) -> list[tuple[str, str, ast.AST, Any]]:
    """(class, site key, node, extra) of one function, in source order (ast.walk is
    breadth-first; sort by position for a deterministic count)."""
    al = dict(aliases)
    al.update(_local_aliases(fn))
    nodes = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    parents = {}
    for p in ast.walk(fn):
        for c in ast.iter_child_nodes(p):
            parents[c] = p
    count: Counter[str] = Counter()
    out = []
    for call in nodes:
        cname = _lib_name(call.func, al)
        if cname is not None:
            count[cname] += 1
            key = f"{cname}#{count[cname]}"
            t = ctypes.get(cname)
            out.append(("skip", key, call, t))
            if t is not None and not call.keywords and not any(isinstance(a, ast.Starred) for a in call.args):
                params = [a.cname for a in t.args]
                seen_pairs = set()
                for i in range(min(len(params), len(call.args))):
                    for j in range(i + 1, min(len(params), len(call.args))):
                        if params[i] != params[j] or params[i] in seen_pairs:
                            continue
                        if ast.dump(call.args[i]) == ast.dump(call.args[j]):
                            continue
                        # adjacent pair of this type: i and the next j of the same type
                        out.append(("swap", f"{key}:{i}<->{j}", call, (i, j)))
                        break
            continue
        name = _call_name(call)
        if name in CHECK_STMT and isinstance(call.func, ast.Name) and isinstance(parents.get(call), ast.Expr):
            count[name] += 1
            out.append(("check", f"{name}#{count[name]}", call, "stmt"))
        elif name in CHECK_WRAP and isinstance(call.func, ast.Name) and call.args:
            count[name] += 1
            out.append(("check", f"{name}#{count[name]}", call, "wrap"))
    return out


def discover(ctypes: dict[str, Any] | None = None) -> list[Mutant]:
    ctypes = _ctypes() if ctypes is None else ctypes
    out = []
    for path in sorted(PKG.rglob("*.py")):
        if "lib" in path.relative_to(PKG).parts[:-1]:
            continue
        rel = path.relative_to(ROOT)
        module = ".".join(rel.with_suffix("").parts)
        if module.endswith(".__init__"):
            module = module[: -len(".__init__")]
        tree = ast.parse(path.read_text())
        aliases = _module_aliases(tree)
        for qual, fn, _cls in _functions(tree):
            for cls, key, _node, _extra in _sites(fn, aliases, ctypes):
                out.append(Mutant(f"{module}:{qual}:{cls}:{key}", module, qual, cls, key, str(rel)))
    return out


# ---------------------------------------------------------------------------- applying
class _Mutator(ast.NodeTransformer):
    def __init__(self, target: ast.AST, cls: str, extra: Any):
        self.target, self.cls, self.extra = target, cls, extra

    def visit_Expr(self, node: ast.Expr) -> Any:
        if node.value is self.target and self.cls == "check" and self.extra == "stmt":
            return ast.copy_location(ast.Pass(), node)
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> Any:
        if node is not self.target:
            return self.generic_visit(node)
        if self.cls == "check":      # wrap: check(x, ...) -> x
            return node.args[0]
        if self.cls == "swap":
            i, j = self.extra
            args = list(node.args)
            args[i], args[j] = args[j], args[i]
            node.args = args
            return node
        # skip: evaluate the arguments, give the neutral value
        t = self.extra
        items = list(node.args) + [kw.value for kw in node.keywords]
        neutral: ast.expr
        if t is None:
            neutral = ast.Constant(None)
        else:
            r = t.result
            if r.kind == "void":
                neutral = ast.Constant(None)
            elif r.kind == "pointer":
                same = [k for k, a in enumerate(t.args) if a.cname == r.cname and k < len(node.args)]
                if same:
                    return ast.Subscript(ast.Tuple(items + [ast.Constant(None)], ast.Load()),
                                         ast.Constant(same[0]), ast.Load())
                neutral = ast.Name("__mutant_NULL__", ast.Load())   # (builtins: ffi.NULL)
            elif r.kind == "primitive" and r.cname in ("float", "double"):
                neutral = ast.Constant(0.0)
            else:
                neutral = ast.Constant(0)
        return ast.Subscript(ast.Tuple(items + [neutral], ast.Load()), ast.Constant(-1), ast.Load())


def _live(module: Any, qualname: str) -> Any:
    """The live function object of `qualname` in `module`."""
    parts = qualname.split(".")
    kind = None
    if parts[-1] in ("setter", "deleter"):
        kind = parts.pop()
    obj: Any = module
    for i, p in enumerate(parts):
        obj = obj.__dict__[p] if i else getattr(obj, p) if not hasattr(obj, "__dict__") else obj.__dict__[p]
    if isinstance(obj, property):
        obj = {None: obj.fget, "setter": obj.fset, "deleter": obj.fdel}[kind]
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if hasattr(obj, "func") and not hasattr(obj, "__code__"):   # functools.partialmethod etc.
        obj = obj.func
    while not hasattr(obj, "__code__") and hasattr(obj, "__wrapped__"):
        obj = obj.__wrapped__
    if hasattr(obj, "__wrapped__") and getattr(obj, "__code__", None) is not None:
        # functools.wraps-style decorators: the undecorated function is the one in the source
        inner = obj
        while hasattr(inner, "__wrapped__"):
            inner = inner.__wrapped__
        obj = inner
    return obj


def _mutated_function(m: Mutant) -> tuple[ast.Module, Any, str | None]:
    """Parse `m`'s module and write the mutant into its function, in place: (the module's
    tree, the function's node, its class name)."""
    from ggml_py._loader import ffi
    builtins.__mutant_NULL__ = ffi.NULL    # type: ignore[attr-defined]
    tree = ast.parse((ROOT / m.path).read_text())
    ctypes = _ctypes()
    aliases = _module_aliases(tree)
    for qual, fn, clsname in _functions(tree):
        if qual != m.qualname:
            continue
        for cls, key, node, extra in _sites(fn, aliases, ctypes):
            if cls == m.cls and key == m.site:
                return tree, _Mutator(node, cls, extra).visit(fn), clsname
        raise LookupError(f"{m.name}: site not found")
    raise LookupError(f"{m.name}: function not found")


def apply(m: Mutant) -> None:
    """Put mutant `m` into the live, imported package (the current process only)."""
    import importlib
    module = importlib.import_module(m.module)
    _tree, fn, clsname = _mutated_function(m)
    fn.decorator_list = []
    target = _live(module, m.qualname)
    free = target.__code__.co_freevars
    body = [ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None)) for v in free if v != "__class__"]
    if free:    # keep every free variable free, in the same order
        fn.body.insert(0, ast.If(ast.Constant(0), [ast.Expr(ast.Tuple(
            [ast.Name(v, ast.Load()) for v in free], ast.Load()))], []))
    holder = ast.ClassDef(clsname or "_M", [], [], [fn], [])
    body.append(holder)
    body.append(ast.Return(ast.Attribute(ast.Name(holder.name, ast.Load()), fn.name, ast.Load())))
    mk = ast.FunctionDef("__mk", ast.arguments([], [], None, [], [], None, []), body, [], None)
    mod = ast.fix_missing_locations(ast.Module([mk], []))
    ns: dict[str, Any] = dict(module.__dict__)
    exec(compile(mod, str(ROOT / m.path), "exec"), ns)
    new = ns["__mk"]()
    if isinstance(new, (staticmethod, classmethod)):
        new = new.__func__
    target.__code__ = new.__code__
    _announce(m.name)


def _announce(name: str) -> None:
    """Say that mutant `name` is in place (GGML_PY_MUTANT_ANNOUNCE: a file, since pytest
    captures fd 1 and 2 while it imports)."""
    note = os.environ.get("GGML_PY_MUTANT_ANNOUNCE")
    if note:
        with open(note, "a") as f:
            f.write(f"{APPLIED}{name}\n")


# ---------------------------------------------------------------------------- child processes
# Tests that run ggml_py in a child process (the corpus, the CLI, the generated cases, RPC
# servers) see the mutant and are mapped through this sitecustomize, put first on PYTHONPATH:
# with GGML_PY_MUTANT it applies that mutant right after its module is imported; with
# GGML_PY_MAP_OUT it records the ggml_py functions the process calls, one line each, in a file
# of that folder.
SITE = CACHE / "site"
_SITECUSTOMIZE = '''
import os, sys
_tool = os.environ.get("GGML_PY_MUTANT_TOOL")
if _tool and os.environ.get("GGML_PY_MUTANT"):
    import importlib.abc, importlib.machinery, importlib.util
    _spec = importlib.util.spec_from_file_location("_ggml_py_mutants", _tool)
    _tm = importlib.util.module_from_spec(_spec)
    sys.modules["_ggml_py_mutants"] = _tm
    _spec.loader.exec_module(_tm)
    _tm.install_hook(os.environ["GGML_PY_MUTANT"])
_out = os.environ.get("GGML_PY_MAP_OUT")
if _out and _tool:
    import threading
    _root = os.path.dirname(os.path.dirname(os.path.abspath(_tool))) + os.sep
    _pkg = _root + "ggml_py" + os.sep
    _seen = {}
    _f = []
    def _hook(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in _seen:
            return
        fn = code.co_filename
        q = None
        if fn.startswith(_pkg):
            mod = fn[len(_root):-3].replace(os.sep, ".")
            if mod.endswith(".__init__"):
                mod = mod[:-9]
            q = mod + ":" + code.co_qualname.split(".<locals>.")[0]
        _seen[code] = q
        if q:
            if not _f:
                _f.append(open(os.path.join(_out, f"{os.getpid()}.txt"), "a", buffering=1))
            _f[0].write(q + "\\n")
    sys.setprofile(_hook)
    threading.setprofile(_hook)
'''


def _write_site() -> None:
    SITE.mkdir(parents=True, exist_ok=True)
    (SITE / "sitecustomize.py").write_text(_SITECUSTOMIZE)


def _child_environ(**extra: str) -> None:
    """This process's environment, for the children its tests start."""
    _write_site()
    path = [str(SITE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    os.environ["GGML_PY_MUTANT_TOOL"] = str(Path(__file__).resolve())
    os.environ.update(extra)


def _apply_named(name: str) -> None:
    try:
        apply(next(x for x in discover() if x.name == name))
    except BaseException as e:     # say so, rather than let a test fail as if killed
        _apply_named_failed(e)


def mutated_module(m: Mutant) -> Any:
    """The code of `m`'s whole module with the mutant written in: for a module that runs as
    ``__main__`` (``python -m``), whose functions exist only once its code runs."""
    tree, _fn, _cls = _mutated_function(m)
    return compile(ast.fix_missing_locations(tree), str(ROOT / m.path), "exec")


def _hook_main(name: str, module: str) -> None:
    """`python -m module`: runpy compiles the module's code itself (``loader.get_code``, not
    ``exec_module``) and runs it as ``__main__``, so the import hook below never sees it. Hand
    runpy the mutated code instead."""
    import runpy
    real = runpy._get_module_details          # type: ignore[attr-defined]

    def details(mod_name: str, error: Any = ImportError) -> Any:
        got, spec, code = real(mod_name, error)
        if got == module:
            try:
                code = mutated_module(next(x for x in discover() if x.name == name))
            except BaseException as e:
                _apply_named_failed(e)
            _announce(name)
        return got, spec, code
    runpy._get_module_details = details       # type: ignore[attr-defined]


def _apply_named_failed(e: BaseException) -> None:
    note = os.environ.get("GGML_PY_MUTANT_ANNOUNCE")
    if note:
        with open(note, "a") as f:
            f.write(f"MUTANT NOT APPLIED: {type(e).__name__}: {e}\n")
    os._exit(99)


def install_hook(name: str) -> None:
    """In a child process: apply mutant `name` once its module has been imported (or, run as
    ``python -m`` that module, to the code runpy runs)."""
    module = name.split(":")[0]
    argv = getattr(sys, "orig_argv", [])
    if any(a == "-m" and b == module for a, b in zip(argv, argv[1:])):
        _hook_main(name, module)
        return
    if module in sys.modules:
        _apply_named(name)
        return

    done: list[bool] = []          # applied (once: by whichever of the two comes first)

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != module:
                # a finder put before this one takes the import from it (pytest's assertion
                # rewriter, for every module of a package that registers a plugin): move back
                # in front, so that a module imported later (gg.rpc loads lazily, through
                # importlib, which no import statement sees) comes through here
                if sys.meta_path and sys.meta_path[0] is not self and self in sys.meta_path:
                    sys.meta_path.remove(self)
                    sys.meta_path.insert(0, self)
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            orig = loader.exec_module

            def exec_module(mod: Any) -> None:
                # one loader may load many modules (pytest's rewriter is one object): only
                # this one, and only once
                if getattr(mod, "__name__", None) != module or done:
                    orig(mod)
                    return
                done.append(True)
                loader.exec_module = orig        # type: ignore[method-assign]
                # the module's code with the mutant written in, run from its first line: a
                # function the module itself calls while it loads (the type table's
                # GGMLType.__new__, the loader's _log.install) runs mutated too
                try:
                    code = mutated_module(next(x for x in discover() if x.name == name))
                except BaseException as e:
                    _apply_named_failed(e)
                exec(code, mod.__dict__)
                _announce(name)
            loader.exec_module = exec_module      # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())

    # A finder put before this one takes the import from it: pytest's assertion rewriter does
    # for every module of a package that registers a pytest plugin (ggml_py does), so a
    # `python -m pytest` child imported the package unmutated. So also look after every import
    # statement until the module has finished executing, and apply the mutant then. (Alone,
    # that came too late for a lazily loaded module: a test of gg.rpc ran unmutated, and the
    # mutant was applied at the next import statement, in pytest's summary.)
    real_import = builtins.__import__

    def watching_import(*args: Any, **kwargs: Any) -> Any:
        result = real_import(*args, **kwargs)
        mod = sys.modules.get(module)
        if done or mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
            if done and builtins.__import__ is watching_import:
                builtins.__import__ = real_import
            return result
        done.append(True)
        builtins.__import__ = real_import
        _apply_named(name)
        return result
    builtins.__import__ = watching_import


# ---------------------------------------------------------------------------- the test map
def _tree_hash() -> str:
    h = hashlib.sha256()
    for d in (PKG, ROOT / "tests"):
        for p in sorted(d.rglob("*.py")):
            if "lib" not in p.relative_to(ROOT).parts[1:-1]:
                h.update(str(p.relative_to(ROOT)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


class _MapPlugin:
    """Records, per test, the ggml_py functions it calls (setup and call phases), and its
    duration."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.calls: dict[str, set[str]] = defaultdict(set)
        self.durations: dict[str, float] = defaultdict(float)
        self.failed: set[str] = set()
        self.qual: dict[Any, str | None] = {}
        self.dirs: dict[str, Path] = {}
        self.outdir = CACHE / "map-children"
        import shutil
        shutil.rmtree(self.outdir, ignore_errors=True)
        pkg = str(PKG) + os.sep
        self.pkg = pkg

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or self.current is None:
            return
        code = frame.f_code
        q = self.qual.get(code, 0)
        if q == 0:
            fn = code.co_filename
            if fn.startswith(self.pkg):
                mod = ".".join(Path(fn).relative_to(ROOT).with_suffix("").parts)
                if mod.endswith(".__init__"):
                    mod = mod[: -len(".__init__")]
                parts = code.co_qualname.split(".<locals>.")[0]
                q = f"{mod}:{parts}"
            else:
                q = None
            self.qual[code] = q
        if q:
            self.calls[self.current].add(q)

    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        import threading
        self.current = item.nodeid
        self.n = getattr(self, "n", 0) + 1
        out = self.outdir / str(self.n)
        out.mkdir(parents=True, exist_ok=True)
        self.dirs[item.nodeid] = out
        os.environ["GGML_PY_MAP_OUT"] = str(out)
        sys.setprofile(self._hook)
        threading.setprofile(self._hook)
        return None

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.durations[report.nodeid] += report.duration
        if report.failed:
            self.failed.add(report.nodeid)
        if report.when == "teardown":
            sys.setprofile(None)
            import threading
            threading.setprofile(None)      # type: ignore[arg-type]
            self.current = None


def build_map(tests: list[str], path: Path) -> dict[str, Any]:
    """Child process: run `tests` under the recorder and write the map to `path`."""
    import pytest
    plugin = _MapPlugin()
    rc = pytest.main(["-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-m", "not slow",
                      *[f"--ignore=tests/{e}" for e in EXCLUDE_TESTS], *tests], plugins=[plugin])
    # what child processes called: given to every test of the file whose test started them
    # (a module-scoped fixture runs its child in the first test's setup, for all of them)
    sub: dict[str, set[str]] = defaultdict(set)
    for test, d in plugin.dirs.items():
        for f in d.glob("*.txt"):
            sub[test.split("::")[0]].update(f.read_text().split())
    for test in plugin.durations:
        plugin.calls[test].update(sub.get(test.split("::")[0], ()))
    by_fn: dict[str, list[str]] = defaultdict(list)
    for test, fns in plugin.calls.items():
        if test in plugin.failed:
            continue         # a test failing unmutated cannot judge a mutant
        for f in fns:
            by_fn[f].append(test)
    data = {"rc": int(rc), "durations": plugin.durations, "functions": by_fn,
            "failed": sorted(plugin.failed)}
    path.write_text(json.dumps(data))
    return data


def get_map(tests: list[str], fresh: bool) -> dict[str, Any]:
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"map-{_tree_hash()}-{hashlib.sha256(' '.join(tests).encode()).hexdigest()[:8]}.json"
    if path.exists() and not fresh:
        return json.loads(path.read_text())
    t0 = time.monotonic()
    print(f"mapping tests to functions ({' '.join(tests)}) ...", flush=True)
    # the checkout first, then what the caller's PYTHONPATH holds (cffi may live there)
    pp = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    r = subprocess.run([sys.executable, __file__, "--map-worker", str(path), *tests], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=pp))
    if not path.exists():
        raise SystemExit(f"the mapping run died (exit {r.returncode})")
    data = json.loads(path.read_text())
    if not data["durations"]:
        path.unlink()
        raise SystemExit(f"the mapping run mapped no test (pytest exit {r.returncode}): every "
                         "mutant would read 'no tests'; see the output above")
    print(f"mapped {len(data['durations'])} tests in {time.monotonic() - t0:.0f}s "
          f"({len(data['failed'])} failed unmutated, left out)", flush=True)
    return data


def merge_maps(maps: list[dict[str, Any]]) -> dict[str, Any]:
    """One map of several (a later map's tests replace an earlier's of the same id)."""
    out: dict[str, Any] = {"rc": 0, "durations": {}, "functions": defaultdict(set), "failed": []}
    for m in maps:
        out["durations"].update(m["durations"])
        out["failed"] += m.get("failed", [])
        for fn, tests in m["functions"].items():
            out["functions"][fn].update(tests)
    out["functions"] = {fn: sorted(ts) for fn, ts in out["functions"].items()}
    return out


# ---------------------------------------------------------------------------- running
def _select(m: Mutant, tmap: dict[str, Any], cap: int) -> list[str]:
    """The mapped tests that call the mutant's function, the most targeted first (those that
    call the fewest functions of the package: a refusal test stops early), then the fastest."""
    fn = m.function
    for suffix in (".setter", ".deleter"):      # (a code object's qualname has neither)
        fn = fn.removesuffix(suffix)
    tests = tmap["functions"].get(fn, [])
    dur = tmap["durations"]
    if _import_time(m):         # it ran while the package loaded: before every test
        tests = list(dur)
    if "_width" not in tmap:
        width: Counter[str] = Counter()
        for ts in tmap["functions"].values():
            width.update(ts)
        tmap["_width"] = width
    width = tmap["_width"]
    def rank(t: str) -> int:
        f = t.split("::")[0].rsplit("/", 1)[-1]
        if f == "test_corpus.py":
            return 3             # its module fixture runs the whole corpus (~30 s): last
        if f.startswith("test_mutants_killed"):
            return -1            # written against the mutants (each sample's file): first
        if m.cls == "check" and f in REFUSAL_TESTS:
            return 0             # a removed rule: the refusal tests first
        return 1
    tests = sorted(set(tests), key=lambda t: (rank(t), width[t], dur.get(t, 0.0), t))
    return tests[:cap] if cap else tests


PYTEST_ARGS = ["-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
               "-W", "ignore::pytest.PytestUnraisableExceptionWarning"]
APPLIED = "ggml_py mutant applied: "


def _child(m: Mutant | None, tests: list[str], log: Path) -> None:
    os.setsid()
    fd = os.open(str(log), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        _child_environ(GGML_PY_MUTANT=m.name if m else "")
        if m is not None:
            apply(m)
    except BaseException as e:     # a mutant that cannot be applied is a tool error
        print(f"MUTANT NOT APPLIED: {type(e).__name__}: {e}", flush=True)
        os._exit(99)
    import pytest
    # the test ids hold brackets and spaces: pass them in a file
    rc = pytest.main([*PYTEST_ARGS, *tests])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(rc))


def _spawn(m: Mutant | None, tests: list[str], log: Path) -> int:
    """A fresh `python -m pytest` process (its own session) whose sitecustomize applies the
    mutant on import and says so (APPLIED): for builds whose devices do not survive fork()."""
    note = log.with_suffix(".applied")
    note.unlink(missing_ok=True)
    env = dict(os.environ, GGML_PY_MUTANT=m.name if m else "", GGML_PY_MUTANT_ANNOUNCE=str(note),
               GGML_PY_MUTANT_TOOL=str(Path(__file__).resolve()))
    _write_site()
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(ROOT)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    with open(log, "wb") as f:
        p = subprocess.Popen([sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests],
                             cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
    _SPAWNED[p.pid] = p      # held, so that subprocess's reaping of dropped Popens (on the
    return p.pid             # next Popen) cannot take its status before run_one's waitpid


_SPAWNED: dict[int, subprocess.Popen[bytes]] = {}


SPAWN = [False]      # set by main(): fork() cannot carry an accelerator's state to children


def run_one(m: Mutant | None, tests: list[str], timeout: float, logdir: Path
            ) -> tuple[str, str, float]:
    """(outcome, detail, seconds): outcome killed / survived / timeout / error. `m` None:
    the control, the same run without a mutant."""
    log = logdir / (hashlib.sha256((m.name if m else "control").encode()).hexdigest()[:12]
                    + ".log")
    t0 = time.monotonic()
    if SPAWN[0] or (m is not None and _import_time(m)):
        pid = _spawn(m, tests, log)
    else:
        pid = os.fork()
        if pid == 0:
            try:
                _child(m, tests, log)
            finally:
                os._exit(98)
    deadline = t0 + timeout
    status = None
    while True:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            _SPAWNED.pop(pid, None)
        if done:
            status = st
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    secs = time.monotonic() - t0
    if status is None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        _SPAWNED.pop(pid, None)
        _reap_group(pid)
        return "timeout", f"over {timeout:.0f}s", secs
    _reap_group(pid)
    text = log.read_text(errors="replace") if log.exists() else ""
    tail = text.strip().splitlines()[-1] if text.strip() else ""
    if SPAWN[0] and m is not None:
        note = log.with_suffix(".applied")
        said = note.read_text() if note.exists() else ""
        if APPLIED + m.name not in said:
            return "error", (said.strip() or "MUTANT NOT APPLIED: the pytest process never "
                             "applied it")[:200], secs
    if os.WIFSIGNALED(status):
        return "killed", f"test process died (signal {os.WTERMSIG(status)})", secs
    rc = os.WEXITSTATUS(status)
    if rc == 0:
        return "survived", tail, secs
    if rc in (99, 98):
        return "error", (text.strip().splitlines() or ["?"])[0][:200], secs
    if rc in (3, 4, 5):
        # applied, but the selected tests are no longer collected as they were (a device
        # list or parameter computed at collection changed): the suite notices
        return "killed", f"test collection changed (pytest rc {rc}): {tail}"[:200], secs
    failed = next((ln for ln in text.splitlines() if ln.startswith("FAILED") or ln.startswith("ERROR")), tail)
    return "killed", failed[:200], secs


def _reap_group(pgid: int) -> None:
    """Kill what the child left in its process group (RPC servers of its session)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _accelerators() -> list[str]:
    """The loaded build's registries other than CPU, RPC and BLAS (CUDA, Vulkan, Metal...)."""
    from ggml_py._loader import ffi, lib
    names = [ffi.string(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i))).decode()
             for i in range(lib.ggml_backend_reg_count())]
    return [n for n in names if n not in ("CPU", "RPC", "BLAS")]


#: (file, qualified name) of the package's functions that ran while the package's own modules
#: loaded (called, directly or not, from a module body of ggml_py): a forked child would get
#: what they made unmutated, so their mutants run in a fresh process (run_one)
IMPORT_TIME: set[tuple[str, str]] = set()


def _record_import_time(frame: Any, event: str, arg: Any) -> None:
    if event != "call":
        return
    if not frame.f_code.co_filename.startswith(str(PKG)):
        return
    f = frame.f_back
    while f is not None:
        code = f.f_code
        if code.co_name == "<module>" and code.co_filename.startswith(str(PKG)):
            fc = frame.f_code
            IMPORT_TIME.add((fc.co_filename, getattr(fc, "co_qualname", fc.co_name)))
            return
        f = f.f_back


def _import_time(m: Mutant) -> bool:
    return (str(ROOT / m.path), m.qualname) in IMPORT_TIME


def find_import_time() -> None:
    """Fill IMPORT_TIME: in a fresh interpreter (this one has imported the package already,
    to list the mutants), import the package and every module of it under a profiler."""
    code = ("import json, sys; sys.path[:0] = [%r, %r]; import mutants; "
            "sys.setprofile(mutants._record_import_time); mutants._import_package(); "
            "sys.setprofile(None); print(json.dumps(sorted(mutants.IMPORT_TIME)))"
            % (str(ROOT / "tools"), str(ROOT)))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    if r.returncode:
        raise SystemExit(f"importing the package under a profiler failed:\n{r.stderr[-2000:]}")
    IMPORT_TIME.update(tuple(x) for x in json.loads(r.stdout.strip().splitlines()[-1]))


def _import_package() -> None:
    """Import ggml_py and every module of it (lazily loaded ones included)."""
    import importlib
    import ggml_py  # noqa: F401
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(ROOT).with_suffix("")
        if "lib" in rel.parts[1:] or rel.parts[-1] == "__main__":
            continue
        name = ".".join(rel.parts).removesuffix(".__init__")
        try:
            importlib.import_module(name)
        except Exception:
            pass


def _warm(tmap: dict[str, Any]) -> None:
    """Import ggml_py and the mapped test modules once, before forking (no compute)."""
    import importlib
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    import ggml_py  # noqa: F401
    for mod in sorted({t.split("::")[0] for t in tmap["durations"]}):
        folder = str((ROOT / mod).parent)     # pytest imports a test module from its folder
        if folder not in sys.path:
            sys.path.insert(1, folder)
        name = Path(mod).stem
        try:
            importlib.import_module(name)
        except Exception:
            pass
        except BaseException as e:       # pytest.importorskip's Skipped is no Exception
            if type(e).__name__ != "Skipped":
                raise
    _import_package()


def sample(mutants: list[Mutant], n: int, seed: int, cover: bool = True) -> list[Mutant]:
    """At least one mutant of every function (so every function is reached), then seeded
    random others up to n."""
    rng = random.Random(seed)
    by_fn: dict[str, list[Mutant]] = defaultdict(list)
    for m in mutants:
        by_fn[m.function].append(m)
    chosen = [rng.choice(ms) for _f, ms in sorted(by_fn.items())] if cover else []
    rest = [m for m in mutants if m not in chosen]
    rng.shuffle(rest)
    chosen += rest[: max(0, n - len(chosen))]
    return sorted(chosen, key=lambda m: m.name)


def reason(r: dict[str, Any]) -> str:
    """Why a mutant was not killed, where its class says so; else what was seen."""
    name, outcome = r["name"], r["outcome"]
    if outcome == "no tests":
        return "no test of the mapped suite calls this function in-process or in a child: a test gap"
    if outcome == "timeout":
        return "the selected tests ran past the timeout (this machine was loaded): not counted as killed"
    if outcome == "error":
        return f"not applied: {r['detail']}"
    if ":swap:ggml_backend_tensor_copy_async#1:0<->1" in name:
        return ("equivalent on CPU + RPC: without a native cpy_tensor_async ggml synchronizes both "
                "backends and copies by buffer, so which backend is which is unobservable; "
                "observable on CUDA/Vulkan/Metal (queue order)")
    if "_lock#" in name or "_unlock#" in name:
        return "a lock: unobservable without a second thread racing it in the selected tests"
    if ":skip:ggml_backend_synchronize#" in name or ":skip:ggml_backend_event_" in name:
        return "CPU and RPC backends are synchronous here: unobservable on CPU + RPC (observable on GPU queues)"
    return (f"survived the {r['tests']} most targeted tests that call it ({r['detail']}): a test gap "
            "or an unobservable change, not analysed further in this session")


def report(results: list[dict[str, Any]], out: Path | None) -> str:
    lines = []
    outcomes = ("killed", "survived", "timeout", "no tests", "error")

    def table(key: str, title: str) -> None:
        groups: dict[str, Counter[str]] = defaultdict(Counter)
        for r in results:
            groups[r[key]][r["outcome"]] += 1
        lines.append(f"| {title} | mutants | " + " | ".join(outcomes) + " | killed % |")
        lines.append("|---|---:|" + "---:|" * len(outcomes) + "---:|")
        total: Counter[str] = Counter()
        for g in sorted(groups):
            c = groups[g]
            total.update(c)
            n = sum(c.values())
            lines.append(f"| {g} | {n} | " + " | ".join(str(c[o]) for o in outcomes)
                         + f" | {100 * c['killed'] / n:.1f} |")
        n = sum(total.values())
        lines.append(f"| **all** | {n} | " + " | ".join(str(total[o]) for o in outcomes)
                     + f" | {100 * total['killed'] / max(n, 1):.1f} |")
        lines.append("")

    table("cls", "class")
    table("module", "module")
    lines.append("Not killed, with the reason as far as it is known:\n")
    for r in results:
        if r["outcome"] != "killed":
            lines.append(f"- `{r['name']}` ({r['outcome']}, {r['tests']} tests): {reason(r)}")
    text = "\n".join(lines)
    if out:
        out.write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--map-worker":
        sys.path.insert(0, str(ROOT))
        _child_environ()
        build_map(argv[2:], Path(argv[1]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", action="append", default=[], help="only mutants whose name contains this")
    p.add_argument("--class", dest="classes", action="append", choices=CLASSES)
    p.add_argument("--list", action="store_true")
    p.add_argument("--sample", type=int, default=0,
                   help="a seeded sample of this many mutants, at least one per function")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cover", action="store_true",
                   help="--sample draws N mutants at random, without one per function first "
                        "(a small sample that fits CI's time)")
    p.add_argument("--cap", type=int, default=40, help="at most this many tests per mutant (fastest first; 0: all)")
    p.add_argument("--cap2", type=int, default=400,
                   help="a survivor of the first pass runs again on this many (0: all)")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--runner", choices=("auto", "fork", "spawn"), default="auto",
                   help="fork: a child of this process per mutant (fast); spawn: a fresh "
                        "pytest process per mutant; auto: spawn when the build has an "
                        "accelerator (its state does not survive fork()), else fork")
    p.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at once")
    p.add_argument("--tests", nargs="*", default=DEFAULT_TESTS)
    p.add_argument("--fresh-map", action="store_true")
    p.add_argument("--map", type=Path, action="append",
                   help="use this map file (as written by an earlier run) as it is; repeated: "
                        "the maps are merged (e.g. the suite's map and one of a new test file)")
    p.add_argument("--names", type=Path,
                   help="only the mutants named in this file, one a line (e.g. the last run's "
                        "survivors: --names <(jq -r '.[]|select(.outcome!=\"killed\").name' run.json))")
    p.add_argument("--min-kill", type=float, default=0.0,
                   help="exit 1 when killed / (mutants with tests) is below this percentage")
    p.add_argument("--json", type=Path, help="write every result here")
    p.add_argument("--render", type=Path, help="print the report of a --json file and exit")
    p.add_argument("--report", type=Path, help="write the tables here (markdown)")
    args = p.parse_args(argv)
    if args.render:
        results = json.loads(args.render.read_text())
        for r in results:      # (runs before rc 3-5 counted as killed)
            if r["outcome"] == "error" and r["detail"].startswith("pytest rc "):
                r["outcome"], r["detail"] = "killed", "test collection changed: " + r["detail"]
        print(report(results, args.report))
        return 0
    mutants = discover()
    mutants = [m for m in mutants if all(k in m.name for k in args.k)]
    if args.classes:
        mutants = [m for m in mutants if m.cls in args.classes]
    if args.sample:
        mutants = sample(mutants, args.sample, args.seed, cover=not args.no_cover)
    if args.names:
        # in the file's order (two machines can take one list from its two ends)
        wanted = {n: i for i, n in enumerate(dict.fromkeys(
            ln.strip() for ln in args.names.read_text().splitlines()
            if ln.strip() and not ln.startswith("#")))}
        gone = wanted.keys() - {m.name for m in mutants}
        if gone:
            print(f"{len(gone)} named mutants no longer exist (code changed; rename them in "
                  f"{args.names}): " + ", ".join(sorted(gone)[:5]), file=sys.stderr)
            if args.min_kill and not args.list:
                return 2         # a must-kill list that silently shrinks checks nothing
        mutants = sorted((m for m in mutants if m.name in wanted), key=lambda m: wanted[m.name])
    if args.list:
        for m in mutants:
            print(m.name)
        print(f"{len(mutants)} mutants in {len({m.function for m in mutants})} functions", file=sys.stderr)
        return 0
    tmap = merge_maps([json.loads(m.read_text()) for m in args.map]) if args.map \
        else get_map(args.tests, args.fresh_map)
    _warm(tmap)
    find_import_time()
    accel = _accelerators()
    SPAWN[0] = args.runner == "spawn" or (args.runner == "auto" and bool(accel))
    if SPAWN[0]:
        print(f"each mutant in a fresh pytest process ({', '.join(accel) or '--runner spawn'}"
              ": an accelerator's state does not survive fork())", flush=True)
    logdir = CACHE / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    t_all = time.monotonic()
    done = [0]
    # the control: the same runner, no mutant, over the tests of the first mutants; every
    # verdict below is void unless it passes (a runner that kills everything is no test)
    control = sorted({t for m in mutants[:8] for t in _select(m, tmap, args.cap)})[:60]
    if control:
        outcome, detail, secs = run_one(None, control, args.timeout, logdir)
        print(f"control (no mutant, {len(control)} tests): {outcome} in {secs:.1f}s", flush=True)
        if outcome != "survived":
            print(f"the control run failed ({detail}): the runner breaks the tests without a "
                  "mutant, so no verdict would mean anything", file=sys.stderr)
            return 3

    def one(m: Mutant) -> dict[str, Any]:
        tests = _select(m, tmap, args.cap)
        if not tests:
            outcome, detail, secs = "no tests", "no mapped test calls this function", 0.0
        else:
            outcome, detail, secs = run_one(m, tests, args.timeout, logdir)
            more = _select(m, tmap, args.cap2)
            if outcome == "survived" and len(more) > len(tests):
                tests = more          # a second pass over more of the tests that call it
                outcome, detail, s2 = run_one(m, tests, args.timeout, logdir)
                secs += s2
        done[0] += 1
        r = {"name": m.name, "module": m.module, "function": m.function, "cls": m.cls,
             "outcome": outcome, "detail": detail, "tests": len(tests), "seconds": round(secs, 2)}
        if args.json:            # one line per mutant as it ends: a run cut short still counts
            with open(str(args.json) + ".partial", "a") as f:
                f.write(json.dumps(r) + "\n")
        print(f"[{done[0]}/{len(mutants)}] {outcome:8s} {secs:5.1f}s {m.name}  "
              f"{detail if outcome != 'killed' else ''}", flush=True)
        return r

    # -j children at once: the parent's threads only fork and wait
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(one, mutants))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print()
    print(report(results, args.report))
    judged = [r for r in results if r["outcome"] != "error"]
    killed = sum(r["outcome"] == "killed" for r in judged)
    rate = 100 * killed / max(len(judged), 1)
    print(f"\n{killed} of {len(judged)} mutants killed ({rate:.1f}%), "
          f"{sum(r['outcome'] == 'error' for r in results)} not applied; "
          f"{time.monotonic() - t_all:.0f}s")
    if any(r["outcome"] == "error" for r in results):
        return 2
    return 1 if rate < args.min_kill else 0


if __name__ == "__main__":
    sys.exit(main())
