"""Delete each hand-named validation rule of ggml_py in turn and show that a test fails without it.

The mutants by class (every C call skipped, every require/check removed, arguments swapped),
generated from the code's structure over the whole surface, are tools/mutants.py; this file
keeps the rules someone named by hand with the tests that guard them (lifetimes, ordering,
the checked fast paths) that those classes do not reach. Each rule is keyed on a stable name,
the module file and the **qualified function** holding it: its text is looked for (exactly
once) inside that function only, so moving code around or editing other functions cannot
break or misplace it, and a renamed function is reported by name.

    python tools/mutate.py            # every mutation; exit 1 if one survives
    python tools/mutate.py -k rows    # those whose name contains "rows"
    python tools/mutate.py --list

Each mutation edits one check in a **copy** of the package (a temporary folder holding
ggml_py/ with its lib/ linked, tests/ and vendor/releases.toml), never the working tree, and
runs the tests that guard that check there. A mutation is "killed" when those tests fail (a
refusal test whose message no longer matches, or a crash of the test process: the rule kept
ggml from aborting). A surviving mutation means a rule no test notices.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def OPS(*cases: str) -> list[str]:
    return [f"tests/rpc/test_ops.py::test_bad_graph_input_raises[{c}]" for c in cases]


def BAD(*cases: str) -> list[str]:
    return [f"tests/rpc/test_bad_input.py::test_bad_input_raises_and_nothing_is_lost[{c}]" for c in cases]


# name: (file, qualified function, text of the rule, what replaces it, pytest arguments that
# must then fail)
MUTATIONS: dict[str, tuple[str, str, str, str, list[str]]] = {
    "binary op repeat rule": (
        "ggml_py/ops/elementwise.py", "binary", "    if not same and (ne_a[0] % ne_b[0]", "    if False and (ne_a[0] % ne_b[0]",
        OPS("gg.add shapes")),
    "binary op layout rule": (
        "ggml_py/ops/elementwise.py", "binary", "    if nb_a[0] != ta._size and ta._block == 1:          # a's rows",
        "    if False:          # a's rows", OPS("gg.add strided a")),
    "binary op float rule": (
        "ggml_py/ops/elementwise.py", "binary", "    if ta not in FLOAT_TYPES or tb not in FLOAT_TYPES:\n",
        "    if False:\n", OPS("gg.add ints")),
    "binary op mixed type rule": (
        "ggml_py/ops/elementwise.py", "binary", '    if ta is not tb and ta != tb and tb._name != "f32":',
        "    if False:", OPS("gg.add mixed types")),
    "mul_mat batch rule": (
        "ggml_py/ops/linalg.py", "mul_mat", "    require(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0,\n            f\"mul_mat: b's",
        "    require(True,\n            f\"mul_mat: b's", OPS("mul_mat batch")),
    "mul_mat inner rule": (
        "ggml_py/ops/linalg.py", "mul_mat", "require(a.ne[0] == b.ne[0], f\"mul_mat: inner", "require(True, f\"mul_mat: inner",
        OPS("mul_mat inner")),
    "mul_mat transposed rule": (
        "ggml_py/ops/linalg.py", "mul_mat", "require(not a.is_transposed,", "require(True,",
        OPS("mul_mat transposed a")),
    "mul_mat BLAS row-stride rule": (
        "ggml_py/ops/linalg.py", "mul_mat", 'blas_rows("mul_mat", ("a", a), ("b", b))', "None",
        ["tests/core/test_fuzz.py", "-k", "blas_valid"]),
    "matmul BLAS row-stride copy": (
        "ggml_py/ops/linalg.py", "_packed", "type_size and blas_rows_ok(t) else", "type_size else",
        ["tests/core/test_fuzz.py", "-k", "blas_valid"]),
    "index range check off by one": (
        "ggml_py/_graph_check.py", "check_indices", "(lo < 0 or hi >= rows)", "(lo < 0 or hi > rows)",
        ["tests/rpc/test_ops.py", "-k", "range_checked"]),
    "copy_async shape rule": (
        "ggml_py/_transfer.py", "copy_async", 'require(src.ne == dst.ne, f"copy_async: shapes differ',
        'require(True, f"copy_async: shapes differ', BAD("copy size differs")),
    "copy_async type rule": (
        "ggml_py/_transfer.py", "copy_async", "require(src.type == dst.type,\n                f\"copy_async: types",
        "require(True,\n                f\"copy_async: types", BAD("copy type differs")),
    "set bounds rule": (
        "ggml_py/_transfer.py", "_host_array", "    if offset + array.nbytes > t.nbytes:", "    if False:",
        BAD("set out of bounds", "set_async out of bounds")),
    "set dtype rule": (
        "ggml_py/_transfer.py", "_host_array", "        if dt != tdt:", "        if False:",
        BAD("set wrong dtype", "set_async wrong dtype")),
    "unallocated tensor rule": (
        "ggml_py/_tensor_base.py", "TensorBase.require_memory", "        if p.buffer == ffi.NULL or p.data == ffi.NULL:\n            raise InvalidArgument",
        "        if False:\n            raise InvalidArgument", BAD("set on unallocated tensor", "numpy of unallocated tensor")),
    "closed context rule": (
        "ggml_py/_tensor_base.py",
        "TensorBase.ptr", "        if self.ctx._raw is None:\n            raise ClosedError(\"this tensor's context is closed\")\n        return self._p",
        "        return self._p", BAD("tensor of closed context")),
    "reduction layout rule": (
        "ggml_py/ops/reduce.py", "sum_rows", '    rows("sum_rows", ("a", a))\n', "",
        OPS("sum_rows transposed")),
    "unary layout rule": (
        "ggml_py/ops/elementwise.py", "_unary", '        rows(name, ("a", a))\n        contiguous(name, ("a", a))\n',
        "", OPS("unary strided")),
    "norm eps rule": (
        "ggml_py/ops/nn.py", "_eps", 'require(e >= 0.0, f"{op}: eps must be >= 0', 'require(True, f"{op}: eps must be >= 0',
        OPS("norm negative eps")),
    "soft_max max_bias rule": (
        "ggml_py/ops/nn.py", "soft_max", 'require(max_bias <= 0.0, "soft_max: max_bias needs a mask',
        'require(True, "soft_max: max_bias needs a mask', OPS("softmax max_bias without mask")),
    "soft_max contiguity rule": (
        "ggml_py/ops/nn.py", "soft_max", '    contiguous("soft_max", ("a", a))\n', "",
        OPS("softmax transposed")),
    "top_k range rule": (
        "ggml_py/ops/reduce.py", "top_k", 'require(1 <= k <= a.ne[0], f"top_k', 'require(True, f"top_k',
        OPS("top_k more than a row")),
    "get_rows shape rule": (
        "ggml_py/ops/index.py", "get_rows", "require(a.ne[2] == idx.ne[1] and a.ne[3] == idx.ne[2] and idx.ne[3] == 1,",
        "require(True,", OPS("get_rows index shape", "get_rows batch of tables")),
    "view bounds rule": (
        "ggml_py/ops/shape.py", "view", "    require(offset >= 0 and last <= a.nbytes,", "    require(True,",
        OPS("view past end", "view negative offset")),
    "reshape count rule": (
        "ggml_py/ops/shape.py", "reshape", "    require(prod(dims) == a.size,", "    require(True,",
        OPS("reshape count")),
    "permute rule": (
        "ggml_py/ops/shape.py", "permute", "require(sorted(ax) == list(range(n)),", "require(True,",
        OPS("permute axes")),
    "conv stride rule": (
        "ggml_py/ops/conv.py", "_im2col_args", "require(s0 > 0 and s1 > 0 and d0 > 0 and d1 > 0 and p0 >= 0 and p1 >= 0,",
        "require(True,", OPS("conv_2d zero stride")),
    "shape axes rule": (
        "ggml_py/_tensor_base.py", "shape_of", 'require(all(s > 0 for s in dims), f"{what}: every axis',
        'require(True, f"{what}: every axis', BAD("bad shape")),
    "shape integer rule": (
        "ggml_py/_tensor_base.py", "index_of", "        return operator.index(value)", "        return int(value)", OPS("tensor float shape")),
    "graph capacity rule": (
        "ggml_py/_graph.py", "Graph._build", "            require(capacity >= count,", "            require(True,",
        OPS("graph capacity too small")),
    # the input memory rule runs in C (ggml_build/helpers.c) where the bindings have it, in
    # Python otherwise: the Python pass is guarded by the generator that compares both ways,
    # the C pass's report by the refusal test
    "graph input memory rule (Python pass)": (
        "ggml_py/_graph_check.py", "in_python", "    for t in leafs:\n        if not t.data:",
        "    for t in leafs:\n        if False:",
        ["tests/rpc/test_graph.py", "-k", "prepare_in_c_and_in_python_agree"]),
    "graph input memory rule (C pass's report)": (
        "ggml_py/_graph_check.py", "in_c", "    elif status == 2:\n        no_memory(t)\n", "",
        OPS("compute unallocated")),
    "scheduler CPU-last rule": (
        "ggml_py/_scheduler.py", "Scheduler.__init__", 'require(backends[-1].device.type == "cpu",', "require(True,",
        OPS("scheduler without cpu last")),
    "scheduler input rule": (
        "ggml_py/_scheduler.py", "Scheduler._check", "                if not int(t.flags) & _INPUT:", "                if False:",
        ["tests/rpc/test_scheduler.py", "-k", "llama_cpp"]),
    "scheduler measures each new graph": (
        "ggml_py/_scheduler.py",
        "Scheduler._alloc", "        if self._measured is not None and self._measured() is not graph:",
        "        if False:", ["tests/rpc/test_scheduler.py", "-k", "afresh"]),
    "scheduler puts back what measuring rewired": (
        "ggml_py/_scheduler.py",
        "Scheduler._measure", "        ok = lib.ggml_backend_sched_reserve(self.ptr, graph.ptr)\n        _rewire.restore(sources)\n",
        "        ok = lib.ggml_backend_sched_reserve(self.ptr, graph.ptr)\n",
        ["tests/rpc/test_scheduler.py", "-k", "in_turn"]),
    "buffer max size rule": (
        "ggml_py/_device.py", "BufferType.alloc", "        if n > self.max_size:", "        if False:",
        BAD("buffer over max size")),
    "closed buffer unallocates its tensors": (
        "ggml_py/_context.py", "Context.alloc", "                buf.on_close(functools.partial(self._lose, b))\n", "",
        ["tests/core/test_tensor.py", "-k", "closing_a_buffer"]),
    "RPC port rule": (
        "ggml_py/rpc.py", "parse_endpoint", "require(port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536,",
        "require(True,", ["tests/rpc/test_rpc.py", "-k", "malformed"]),
    "result context rule (one construction path)": (
        "ggml_py/ops/_common.py", "build", "    ctx = owner.ctx\n", "    ctx = next(iter(uses), owner).ctx  # type: ignore[call-overload]\n",
        ["tests/core/test_tensor.py", "-k", "keeps_the_context"]),
    # the Python half of the checked ops: what reaches helpers.c must be what the rules take
    # (the C half's conditions are compiled into the build; deleting one of them is shown in
    # the note on issue 14 and caught by the same test)
    "checked binary op: operands of one context": (
        "ggml_py/ops/elementwise.py", "binary_op", "            if b.ctx is ctx:\n                # the helper",
        "            if True:\n                # the helper",
        ["tests/core/test_lifetime_keeps.py", "-k", "keeps_alive"]),
    "checked mul_mat: operands of one context": (
        "ggml_py/ops/linalg.py", "mul_mat", "        if b.ctx is ctx:                # the rule below in one C",
        "        if True:                # the rule below in one C",
        ["tests/core/test_lifetime_keeps.py", "-k", "keeps_alive"]),
    "checked soft_max: mask of the same context": (
        "ggml_py/ops/nn.py", "soft_max", "(mask.__class__ is cls and mask.ctx is ctx)",
        "(mask.__class__ is cls)", ["tests/core/test_lifetime_keeps.py", "-k", "keeps_alive"]),
    "checked rope_ext: positions of the same context": (
        "ggml_py/ops/nn.py", "rope_ext", "and freq_factors is None and pos.ctx is a.ctx",
        "and freq_factors is None", ["tests/core/test_lifetime_keeps.py", "-k", "keeps_alive"]),
    # lifetimes of the metadata chunks (ggml_py/_record_pool.py)
    "a closed context's or graph's records go back when collected": (
        "ggml_py/_handle.py", "Owned._close_locked", "        if self._frees_at_close:\n",
        "        if True:\n", ["tests/core/test_record_pool.py", "-k", "closed_graph or retried"]),
    "a free inside a collection waits for its end": (
        "ggml_py/_finalize.py", "_free", "    if _collecting:\n        queue.append", "    if False:\n        queue.append",
        ["tests/core/test_lifetime_cycles.py", "-k", "a_del_in_a_cycle"]),
    "a resurrected object is not freed under it": (
        "ggml_py/_finalize.py", "_drain", "                f = token.finalizer() if token.finalizer is not None else None",
        "                f = None", ["tests/core/test_lifetime_cycles.py", "-k", "resurrect"]),
    "a resurrected object is freed when it dies": (
        "ggml_py/_finalize.py", "_drain", "                    f.rearmed = _watch(f, queue, fn, args)",
        "                    pass", ["tests/core/test_lifetime_cycles.py", "-k", "resurrect"]),
    "a twice-resurrected object keeps its re-armed free": (
        "ggml_py/_finalize.py", "_drain", "                    f.rearmed = _watch(f, queue, fn, args)",
        "                    _watch(f, queue, fn, args)",
        ["tests/core/test_lifetime_cycles.py", "-k", "twice"]),
    "closing a resurrected object frees at once": (
        "ggml_py/_finalize.py", "detach", "    while isinstance(finalizer, _Finalizer) and finalizer.rearmed is not None:",
        "    while False:", ["tests/core/test_lifetime_cycles.py", "-k", "cycle_reads and close"]),
    "a reused chunk is reset first": (
        "ggml_py/_record_pool.py", "release", "                _RESET(raw)\n", "",
        ["tests/core/test_record_pool.py"]),
    "a closed graph refuses to read its nodes": (
        "ggml_py/_graph.py", "Graph.n_nodes", "        self._meta.ptr       # (ClosedError once closed", "        # (",
        ["tests/core/test_record_pool.py", "-k", "closed_graph"]),
    "a closed graph's memory goes back when collected": (
        "ggml_py/_handle.py", "Owned._close_locked", "        if self._frees_at_close:\n",
        "        if True:\n", ["tests/core/test_record_pool.py", "-k", "closed_graph"]),
    "checked permute takes int axes only": (
        "ggml_py/ops/shape.py", "permute", "                if x.__class__ is not int:      # (True == 1",
        "                if False:      # (True == 1", ["tests/core/test_checked.py", "-k", "python_rules"]),
    "checked reshape takes int dims only": (
        "ggml_py/ops/shape.py", "_plain_ne", "        return (s0, 1, 1, 1) if s0.__class__ is int else None",
        "        return (s0, 1, 1, 1)", ["tests/core/test_checked.py", "-k", "python_rules"]),
    "checked norm takes float eps only": (
        "ggml_py/ops/nn.py", "rms_norm", " and eps.__class__ is float:\n        ctx = a.ctx\n        p = _C_NORM(ctx.checked_state, a._p, eps, _RMS_NORM",
        ":\n        ctx = a.ctx\n        p = _C_NORM(ctx.checked_state, a._p, eps, _RMS_NORM",
        ["tests/core/test_checked.py", "-k", "python_rules"]),
}


def _copy_tree(dst: Path) -> None:
    shutil.copytree(ROOT / "ggml_py", dst / "ggml_py",
                    ignore=shutil.ignore_patterns("lib", "__pycache__"))
    os.symlink(ROOT / "ggml_py" / "lib", dst / "ggml_py" / "lib")
    shutil.copytree(ROOT / "tests", dst / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "vendor").mkdir()
    shutil.copy(ROOT / "vendor" / "releases.toml", dst / "vendor" / "releases.toml")
    for extra in ("pyproject.toml",):
        shutil.copy(ROOT / extra, dst / extra)


def function_span(source: str, qualname: str) -> tuple[int, int] | None:
    """(start, end) character offsets of the function or method `qualname` (decorators
    included) in `source`, or None."""
    import ast
    tree = ast.parse(source)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    for node in tree.body:
        pairs = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pairs.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            pairs += [(f"{node.name}.{sub.name}", sub) for sub in node.body
                      if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for q, fn in pairs:
            if q == qualname:
                first = min([d.lineno for d in fn.decorator_list] + [fn.lineno])
                return starts[first - 1], starts[fn.end_lineno or fn.lineno]
    return None


def mutated(source: str, qualname: str, old: str, new: str) -> str | None:
    """`source` with `old` replaced by `new` inside function `qualname`; None unless the
    function exists and holds `old` exactly once."""
    span = function_span(source, qualname)
    if span is None:
        return None
    a, b = span
    if source[a:b].count(old) != 1:
        return None
    return source[:a] + source[a:b].replace(old, new) + source[b:]


def run(name: str, work: Path, timeout: int) -> tuple[bool, str, float]:
    """(killed, how, seconds) for the mutation `name`."""
    path, qual, old, new, args = MUTATIONS[name]
    target = work / path
    original = target.read_text()
    changed = mutated(original, qual, old, new)
    if changed is None:
        return False, f"rule text not found once in {path}:{qual} (update tools/mutate.py)", 0.0
    target.write_text(changed)
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly",
                            "-p", "no:cacheprovider", *args], cwd=work, capture_output=True,
                           text=True, timeout=timeout,
                           env=dict(os.environ, PYTHONPATH=str(work), PYTHONDONTWRITEBYTECODE="1"))
        out = (r.stdout + r.stderr).strip().splitlines()
        tail = out[-1] if out else ""
        if r.returncode < 0:
            return True, f"test process killed by signal {-r.returncode} (the rule kept ggml from crashing)", time.monotonic() - t0
        if r.returncode in (4, 5):
            return False, f"bad test selection (update tools/mutate.py): {tail}", time.monotonic() - t0
        return r.returncode != 0, tail, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return True, "tests hung", time.monotonic() - t0
    finally:
        target.write_text(original)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", default="", help="only mutations whose name contains this")
    p.add_argument("--list", action="store_true")
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args(argv)
    names = [n for n in MUTATIONS if args.k in n]
    if args.list:
        print("\n".join(names))
        return 0
    survived = []
    with tempfile.TemporaryDirectory(prefix="ggml_py_mutate_") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        for name in names:
            killed, how, secs = run(name, work, args.timeout)
            print(f"{'killed  ' if killed else 'SURVIVED'} {name:45s} {secs:5.1f}s  {how}", flush=True)
            if not killed:
                survived.append(name)
    print(f"\n{len(names) - len(survived)} of {len(names)} mutations killed"
          + (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
