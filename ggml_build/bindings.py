"""Generate the cffi bindings of one build from the public headers of the tree it was built from.

Steps: preprocess the headers with the C compiler against empty stand-ins for the libc
headers; parse the result with pycparser; keep the type declarations and the prototypes of
functions the built libraries really export; add the integer ``#define`` constants; write
that cdef (``cdef.h``, generated, never edited) and compile an out-of-line API-mode module
(the compiler then checks every struct layout and constant against the real headers). Where
no C compiler works, an out-of-line ABI-mode module is written instead. Nothing is parsed
when the package is imported.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import BuildError

MODULE = "_ggml_cffi"

BASE_HEADERS = ("ggml.h", "ggml-alloc.h", "ggml-backend.h", "ggml-cpu.h", "ggml-rpc.h",
                "gguf.h", "ggml-opt.h")
BACKEND_HEADERS = {"cuda": "ggml-cuda.h", "metal": "ggml-metal.h", "vulkan": "ggml-vulkan.h"}

# Types cffi knows natively. pycparser does not, so they are typedef'd for the parse only and
# dropped from the output.
_BUILTIN_TYPES = {
    "size_t": "unsigned long", "ssize_t": "long", "ptrdiff_t": "long",
    "intptr_t": "long", "uintptr_t": "unsigned long",
    "int8_t": "signed char", "uint8_t": "unsigned char", "int16_t": "short",
    "uint16_t": "unsigned short", "int32_t": "int", "uint32_t": "unsigned int",
    "int64_t": "long long", "uint64_t": "unsigned long long",
    "bool": "_Bool", "FILE": "struct _IO_FILE",
}
_LIBC = ("stddef.h", "stdint.h", "stdbool.h", "stdio.h", "stdlib.h", "string.h", "assert.h",
         "math.h", "limits.h", "stdarg.h", "inttypes.h")


def headers_for(include: Path, backends) -> list[str]:
    names = list(BASE_HEADERS) + [BACKEND_HEADERS[b] for b in backends if b in BACKEND_HEADERS]
    return [h for h in names if (include / h).is_file()]


def _cc() -> str | None:
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand and shutil.which(cand):
            return cand
    return None


def preprocess(include: Path, headers: list[str], cc: str) -> tuple[str, str]:
    """(preprocessed text, `-dM` macro dump) of `headers` with empty libc stand-ins."""
    with tempfile.TemporaryDirectory(prefix="ggml_py-cdef-") as tmp:
        fake = Path(tmp) / "fake"
        fake.mkdir()
        for name in _LIBC:
            (fake / name).write_text("")
        src = Path(tmp) / "all.h"
        src.write_text("".join(f'#include "{h}"\n' for h in headers))
        base = [cc, "-E", "-nostdinc", "-I", str(fake), "-I", str(include), "-U__GNUC__",
                "-U__clang__", "-D_Noreturn=", "-Drestrict=", "-D__restrict=",
                "-D__attribute__(x)=", "-D__declspec(x)=", "-D__extension__=",
                "-D__asm__(x)=", str(src)]
        out = subprocess.run(base + ["-P"], capture_output=True, text=True)
        if out.returncode != 0:
            raise BuildError(f"preprocessing the headers failed:\n{out.stderr[-2000:]}",
                             "is this a ggml tree with a complete include/ folder?")
        macros = subprocess.run(base[:2] + ["-dM"] + base[2:], capture_output=True, text=True)
        return out.stdout, macros.stdout


def exported_symbols(libs: list[Path]) -> set[str] | None:
    """Names the libraries export, or None where the platform offers no listing (then dlsym)."""
    nm = shutil.which("nm")
    if nm is None:
        return None
    names: set[str] = set()
    for lib in libs:
        args = [nm, "-gU", str(lib)] if sys.platform == "darwin" else [nm, "-D", "--defined-only", str(lib)]
        out = subprocess.run(args, capture_output=True, text=True)
        if out.returncode != 0:
            return None
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] in "TtWwDdBbRrVvi":
                names.add(parts[2].lstrip("_") if sys.platform == "darwin" else parts[2].split("@")[0])
    return names


def _exported(libs: list[Path]):
    names = exported_symbols(libs)
    if names is not None:
        return names.__contains__
    handles = [ctypes.CDLL(str(p)) for p in libs]
    return lambda n: any(hasattr(h, n) for h in handles)


def make_cdef(text: str, is_exported) -> tuple[str, list[str], list[str]]:
    """(cdef text, kept function names, dropped function names) from preprocessed headers."""
    from pycparser import c_ast, c_generator, c_parser

    prelude = "".join(f"typedef {c} {n};\n" for n, c in _BUILTIN_TYPES.items())
    ast = c_parser.CParser().parse(prelude + text, filename="<ggml headers>")
    gen = c_generator.CGenerator()
    _fold_array_sizes(ast)
    lines, kept, dropped, seen = [], [], [], set()
    for node in ast.ext:
        if isinstance(node, c_ast.FuncDef):          # static inline helpers: not in the libs
            continue
        if isinstance(node, c_ast.Typedef):
            if node.name in _BUILTIN_TYPES or ("typedef", node.name) in seen:
                continue                             # C11 allows repeated typedefs; cffi does not
            seen.add(("typedef", node.name))
        if isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            if node.name in seen:
                continue
            seen.add(node.name)
            node.storage = []
            node.funcspec = []
            if not is_exported(node.name):
                dropped.append(node.name)
                continue
            kept.append(node.name)
        elif isinstance(node, c_ast.Decl) and node.name is not None:
            continue                                 # variables such as GGML_TENSOR_SIZE
        lines.append(gen.visit(node) + ";")
    return "\n".join(lines) + "\n", kept, dropped


_SIZEOF = {"char": 1, "signed char": 1, "unsigned char": 1, "short": 2, "unsigned short": 2,
           "int": 4, "unsigned int": 4, "float": 4, "double": 8, "long long": 8,
           "unsigned long long": 8, "long": 8, "unsigned long": 8}


def _fold_array_sizes(ast) -> None:
    """Replace array sizes such as ``GGML_MAX_OP_PARAMS / sizeof(int32_t)`` by their value:
    cffi's cdef accepts plain numbers only."""
    from pycparser import c_ast

    class Folder(c_ast.NodeVisitor):
        def visit_ArrayDecl(self, node):
            if node.dim is not None and not isinstance(node.dim, c_ast.Constant):
                node.dim = c_ast.Constant("int", str(_const_value(node.dim)))
            self.generic_visit(node)

    Folder().visit(ast)


def _const_value(node) -> int:
    from pycparser import c_ast

    if isinstance(node, c_ast.Constant):
        return int(node.value.rstrip("uUlL"), 0)
    if isinstance(node, c_ast.UnaryOp) and node.op == "sizeof":
        names = node.expr.type.type.names
        name = " ".join(names)
        name = _BUILTIN_TYPES.get(name, name)
        return _SIZEOF[name]
    if isinstance(node, c_ast.UnaryOp) and node.op == "-":
        return -_const_value(node.expr)
    if isinstance(node, c_ast.Cast):
        return _const_value(node.expr)
    if isinstance(node, c_ast.BinaryOp):
        a, b = _const_value(node.left), _const_value(node.right)
        ops = {"+": a + b, "-": a - b, "*": a * b, "<<": a << b if b >= 0 else 0,
               ">>": a >> b if b >= 0 else 0, "|": a | b, "&": a & b}
        if node.op == "/":
            return a // b
        return ops[node.op]
    raise BuildError(f"cannot evaluate an array size in the headers: {type(node).__name__}",
                     "report this with the release you are building")


def int_constants(macros: str) -> dict[str, int]:
    """Integer-valued GGML_/GGUF_ macros of the `-dM` dump (plain literals and simple shifts)."""
    found: dict[str, int] = {}
    for line in macros.splitlines():
        m = re.match(r"#define\s+((?:GGML|GGUF|RPC_PROTO)_[A-Z0-9_]+)\s+(.+)$", line)
        if not m:
            continue
        name, value = m.group(1), m.group(2).strip()
        expr = re.sub(r"(?<=[0-9a-fA-F])[uUlL]+\b", "", value)
        if not re.fullmatch(r"[0-9a-fA-FxX()\s<>|+\-*]+", expr) or not re.search(r"\d", expr):
            continue
        try:
            found[name] = int(eval(expr, {"__builtins__": {}}, {}))  # digits and operators only
        except Exception:
            continue
    return found


def generate(out: Path, include: Path, headers: list[str], libs: list[Path],
             release: str, *, abi: bool = False, log=print) -> dict:
    """Write cdef.h and compile the cffi module into `out`. Returns a summary for build.json."""
    import cffi

    cc = _cc()
    if cc is None:
        raise BuildError("no C compiler found to preprocess ggml's headers",
                         "install gcc or clang (Debian: apt-get install build-essential)")
    text, macros = preprocess(include, headers, cc)
    cdef, kept, dropped = make_cdef(text, _exported(libs))
    consts = int_constants(macros)
    banner = (f"/* Generated by build_ggml.py from ggml {release} headers: {', '.join(headers)}.\n"
              f"   Do not edit: rebuild instead. {len(kept)} functions; not exported, left out: "
              f"{', '.join(dropped) or 'none'}. */\n")
    api_consts = "".join(f"#define {n} ...\n" for n in sorted(consts))
    abi_consts = "".join(f"#define {n} {v}\n" for n, v in sorted(consts.items()))
    (out / "cdef.h").write_text(banner + cdef + abi_consts)

    for stale in out.glob(f"{MODULE}*"):
        stale.unlink()
    mode = "abi" if abi else "api"
    if not abi:
        try:
            _compile_api(out, include, headers, libs, cdef + api_consts)
        except Exception as e:  # no working compiler/linker for extensions: fall back
            log(f"API-mode compile failed ({type(e).__name__}: {str(e)[:200]}); "
                "falling back to ABI mode")
            mode = "abi"
    if mode == "abi":
        ffi = cffi.FFI()
        ffi.cdef(cdef + abi_consts)
        ffi.set_source(MODULE, None)
        ffi.emit_python_code(str(out / f"{MODULE}.py"))
    return {"bindings": mode, "functions": len(kept), "function_names": kept,
            "not_exported": dropped,
            "constants": len(consts), "headers": headers}


# ggml_py's own C helpers (helpers.c), compiled into the API-mode module after the generated
# bindings; ABI-mode bindings have none, and Python takes its own path there
HELPERS_CDEF = """
struct ggml_py_prep { int32_t status; int32_t need_alloc; struct ggml_tensor * tensor;
                      int32_t n_index; };
int ggml_py_prepare(struct ggml_cgraph * g, ggml_backend_t be, ggml_backend_dev_t dev,
                    ggml_backend_dev_t cpu, int op_get_rows, int op_set_rows,
                    struct ggml_tensor ** index_out, int index_cap, struct ggml_py_prep * out);
int64_t ggml_py_room(struct ggml_context * ctx);
int ggml_py_copy(struct ggml_tensor * t, void * data, size_t size, int to_tensor);
typedef struct ggml_tensor * (*ggml_py_fn1)(struct ggml_context *, struct ggml_tensor *);
typedef struct ggml_tensor * (*ggml_py_fn2)(struct ggml_context *, struct ggml_tensor *,
                                            struct ggml_tensor *);
struct ggml_py_ctx;
struct ggml_py_ctx * ggml_py_ctx_new(struct ggml_context * head);
void ggml_py_ctx_free(struct ggml_py_ctx * st);
void ggml_py_ctx_lock(struct ggml_py_ctx * st);
void ggml_py_ctx_unlock(struct ggml_py_ctx * st);
void ggml_py_ctx_set_head(struct ggml_py_ctx * st, struct ggml_context * head);
int ggml_py_helpers(void);
int ggml_py_rule(uint64_t mask);
void ggml_py_binary_types(uint64_t types);
struct ggml_tensor * ggml_py_binary(struct ggml_py_ctx * st, ggml_py_fn2 fn,
                                    struct ggml_tensor * a, struct ggml_tensor * b, int numpy);
struct ggml_tensor * ggml_py_unary(struct ggml_py_ctx * st, ggml_py_fn1 fn,
                                   struct ggml_tensor * a, int types);
struct ggml_tensor * ggml_py_mul_mat(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                     struct ggml_tensor * b, int a_types, int b_types);
struct ggml_tensor * ggml_py_norm(struct ggml_py_ctx * st, struct ggml_tensor * a, double eps,
                                  int types, int rms);
struct ggml_tensor * ggml_py_soft_max(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                      struct ggml_tensor * mask, double scale, double max_bias,
                                      int types);
struct ggml_tensor * ggml_py_rope(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                  struct ggml_tensor * pos, int64_t n_dims, int mode,
                                  int n_ctx_orig, double freq_base, double freq_scale,
                                  double ext_factor, double attn_factor, double beta_fast,
                                  double beta_slow, int types);
struct ggml_tensor * ggml_py_reshape(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                     int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
struct ggml_tensor * ggml_py_permute(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                     int p0, int p1, int p2, int p3);
struct ggml_tensor * ggml_py_cont(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                  int strided_types);
"""


# helpers.c locks with pthreads (Windows: SRW locks, nothing to add)
_THREADS = [] if sys.platform == "win32" else ["-pthread"]


def _compile_api(out: Path, include: Path, headers: list[str], libs: list[Path], cdef: str) -> None:
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(cdef + HELPERS_CDEF)
    origin = "@loader_path" if sys.platform == "darwin" else "$ORIGIN"
    helpers = (Path(__file__).with_name("helpers.c")).read_text()
    ffi.set_source(
        MODULE, "".join(f'#include "{h}"\n' for h in headers) + helpers,
        include_dirs=[str(include)], library_dirs=[str(out)],
        libraries=[_link_name(p) for p in libs],
        # -g0: no debug info (Python's CFLAGS carry -g): 1.8 MB less module and ~15 % less
        # compile time for 0.26.0 (benchmarks/RESULTS.md, 2026-12-05 wheels section)
        extra_compile_args=["-Wno-deprecated-declarations", "-g0"] + _THREADS,
        extra_link_args=[f"-Wl,-rpath,{origin}"] + _THREADS)
    with tempfile.TemporaryDirectory(prefix="ggml_py-cffi-") as tmp, _no_interpreter_rpath():
        built = Path(ffi.compile(tmpdir=tmp, verbose=False))
        shutil.copy2(built, out / built.name)


@contextlib.contextmanager
def _no_interpreter_rpath():
    """Link without the building interpreter's `-Wl,-rpath,<its lib folder>` (pyenv and other
    --enable-shared Pythons put it into LDSHARED): a module shipped in a wheel must find its
    libraries through its own $ORIGIN only. distutils takes LDSHARED from the environment."""
    import sysconfig
    ldshared = sysconfig.get_config_var("LDSHARED")
    if not ldshared or "LDSHARED" in os.environ or "-rpath" not in ldshared:
        yield
        return
    os.environ["LDSHARED"] = re.sub(r"\s*-Wl,-rpath,\S+", "", ldshared)
    try:
        yield
    finally:
        del os.environ["LDSHARED"]


def _link_name(lib: Path) -> str:
    name = lib.name
    name = name[3:] if name.startswith("lib") else name
    return name.split(".so")[0].split(".dylib")[0]
