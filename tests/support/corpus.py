"""The bad-input corpus: mistakes a careless or hostile user makes through the public API,
each with the exception and message it must raise. Run by tests/rpc/test_corpus.py in child
processes (``python tests/support/corpus.py`` reads case ids on stdin), so a case that crashes the
process fails alone and by name.

Each case is ``(exception name, message pattern, code)``; the code runs with ``e`` (the
environment below) and ``gg``/``np`` in scope. Cases marked with ``{dev}`` run once per
device kind ("cpu", "rpc"): tensors, backends and contexts of that device.
"""
from __future__ import annotations

import re
import sys

UNARY = ["relu", "gelu", "silu", "tanh", "exp", "sqr", "sqrt", "log", "abs", "neg", "sigmoid",
         "sin", "cos", "step", "elu", "gelu_quick", "hardswish", "hardsigmoid", "sgn"]
BINARY = ["add", "sub", "mul", "div"]
ROWS = ["sum_rows", "mean", "cumsum", "argsort", "soft_max", "norm", "rms_norm"]
F32_ONLY = ["sum", "sum_rows", "mean", "cumsum", "argsort", "argmax"]

CASES: dict[str, tuple[str, str, str]] = {}


def case(name: str, exc: str, pattern: str, code: str) -> None:
    assert name not in CASES, name
    CASES[name] = (exc, pattern, code)


# -- class 1: views and layout ---------------------------------------------------------------
for op in UNARY:
    case(f"{op} of a transposed view", "InvalidArgument", "strided", f"gg.{op}(e['{{dev}}sq'].T)")
    case(f"{op} of a strided view", "InvalidArgument", "contiguous",
         f"gg.{op}(e['{{dev}}sq'].view((8, 4), 0, (32, 4)))")
    case(f"{op} of a permuted view", "InvalidArgument", "strided",
         f"gg.{op}(e['{{dev}}cube'].permute((0, 2, 1)))")
for op in BINARY:
    case(f"gg.{op} transposed first operand", "InvalidArgument", "rows of a .* strided",
         f"gg.{op}(e['{{dev}}sq'].T, e['{{dev}}sq'])")
for op in ROWS:
    case(f"{op} of a transposed view", "InvalidArgument", "strided|contiguous",
         f"gg.{op}(e['{{dev}}sq'].T)")
case("sum of a transposed view", "InvalidArgument", "strided", "gg.sum(e['{dev}sq'].T)")
case("sum of a strided view", "InvalidArgument", "contiguous", "gg.sum(e['{dev}sq'].view((8, 4), 0, (32, 4)))")
case("argmax of a transposed view", "InvalidArgument", "strided", "gg.argmax(e['{dev}sq'].T)")
case("argsort of a strided view", "InvalidArgument", "contiguous", "gg.argsort(e['{dev}sq'].view((8, 4), 0, (32, 4)))")
case("top_k of a transposed view", "InvalidArgument", "contiguous", "gg.top_k(e['{dev}sq'].T, 2)")
case("mul_mat transposed a", "InvalidArgument", "must not be transposed",
     "gg.mul_mat(e['{dev}sq'].T, e['{dev}sq'])")
case("mul_mat strided b", "InvalidArgument", "strided",
     "gg.mul_mat(e['{dev}sq'], e['{dev}cube'].permute((2, 0, 1)))")
case("gg.reshape of a view", "InvalidArgument", "must be contiguous", "gg.reshape(e['{dev}sq'].T, 64)")
case("group_norm of a view", "InvalidArgument", "contiguous", "gg.group_norm(e['{dev}img'].permute((0, 1, 3, 2)), 2)")
case("concat strided", "InvalidArgument", "strided", "gg.concat(e['{dev}sq'].T, e['{dev}sq'], 0)")
case("repeat strided", "InvalidArgument", "strided", "gg.repeat(e['{dev}sq'].T, (16, 8))")
case("pad strided", "InvalidArgument", "strided", "gg.pad(e['{dev}sq'].T, [1, 1])")
case("get_rows strided table", "InvalidArgument", "strided", "gg.get_rows(e['{dev}sq'].T, e['{dev}idx'])")
case("rope strided", "InvalidArgument", "strided", "gg.rope_ext(e['{dev}heads'].permute((0, 1, 3, 2)), e['{dev}pos'], 2)")
case("transpose quantized", "InvalidType", "quantized", "gg.transpose(e['{dev}q'])")
case("permute quantized rows", "InvalidType", "cannot move", "e['{dev}q'].permute((1, 0))")
case("view of quantized", "InvalidType", "quantized", "e['{dev}q'].view((32,))")
case("numpy of a view", "InvalidArgument", "non-contiguous", "e['{dev}sq'].T.numpy(copy=True)")
case("set into a view", "InvalidArgument", "non-contiguous view",
     "e['{dev}sq'].T.set(np.ones((8, 8), np.float32))")

# -- class 2: op parameters ------------------------------------------------------------------
for op in ("norm", "rms_norm"):
    case(f"{op} negative eps", "InvalidArgument", "eps must be >= 0", f"gg.{op}(e['{{dev}}a'], -1e-5)")
    case(f"{op} string eps", "InvalidType", "eps must be a number", f"gg.{op}(e['{{dev}}a'], '1e-5')")
    case(f"{op} None eps", "InvalidType", "eps must be a number", f"gg.{op}(e['{{dev}}a'], None)")
    case(f"{op} tensor eps", "InvalidType", "eps must be a number", f"gg.{op}(e['{{dev}}a'], e['{{dev}}a'])")
case("group_norm negative eps", "InvalidArgument", "eps must be >= 0", "gg.group_norm(e['{dev}img'], 2, -1.0)")
case("group_norm zero groups", "InvalidArgument", "do not split", "gg.group_norm(e['{dev}img'], 0)")
case("group_norm float groups", "InvalidType", "n_groups must be an int", "gg.group_norm(e['{dev}img'], 2.0)")
case("group_norm groups", "InvalidArgument", "do not split", "gg.group_norm(e['{dev}img'], 3)")
case("soft_max max_bias without mask", "InvalidArgument", "max_bias needs a mask", "gg.soft_max(e['{dev}a'], max_bias=2.0)")
case("soft_max string scale", "InvalidType", "scale must be a number", "gg.soft_max(e['{dev}a'], scale='2')")
case("soft_max mask shape", "InvalidArgument", "does not cover", "gg.soft_max(e['{dev}a'], e['{dev}c'])")
case("soft_max int mask", "InvalidType", "mask must be f32 or f16", "gg.soft_max(e['{dev}a'], e['{dev}ia'])")
case("soft_max strided mask", "InvalidArgument", "contiguous", "gg.soft_max(e['{dev}sq'], e['{dev}sq'].T)")
case("top_k zero", "InvalidArgument", "must be in 1..", "gg.top_k(e['{dev}a'], 0)")
case("top_k too many", "InvalidArgument", "must be in 1..", "gg.top_k(e['{dev}a'], 9)")
case("top_k float", "InvalidType", "k must be an int", "gg.top_k(e['{dev}a'], 1.5)")
case("top_k string", "InvalidType", "k must be an int", "gg.top_k(e['{dev}a'], '2')")
case("argsort non-bool", "InvalidType", "descending must be a bool", "gg.argsort(e['{dev}a'], 'yes')")
case("rope odd n_dims", "InvalidArgument", "must be even", "gg.rope_ext(e['{dev}heads'], e['{dev}pos'], 3)")
case("rope zero n_dims", "InvalidArgument", "must be even", "gg.rope_ext(e['{dev}heads'], e['{dev}pos'], 0)")
case("rope n_dims past head", "InvalidArgument", "at most head_dim", "gg.rope_ext(e['{dev}heads'], e['{dev}pos'], 16)")
case("rope float n_dims", "InvalidType", "n_dims must be an int", "gg.rope_ext(e['{dev}heads'], e['{dev}pos'], 4.0)")
case("rope mode 1", "InvalidArgument", "mode must be", "gg.rope_ext(e['{dev}heads'], e['{dev}pos'], mode=1)")
case("rope mrope mode", "InvalidArgument", "mode must be", "gg.rope_ext(e['{dev}heads'], e['{dev}pos'], mode=8)")
case("rope positions f32", "InvalidType", "positions must be i32", "gg.rope_ext(e['{dev}heads'], e['{dev}a'])")
case("rope positions count", "InvalidArgument", "one position per token", "gg.rope_ext(e['{dev}heads'], e['{dev}idx'])")
case("rope freq_factors short", "InvalidType", "freq_factors must be f32", "gg.rope_ext(e['{dev}heads'], e['{dev}pos'], freq_factors=e['{dev}idx'])")
case("rope string base", "InvalidType", "freq_base must be a number", "gg.rope_ext(e['{dev}heads'], e['{dev}pos'], freq_base='1e4')")
case("flash_attn head sizes", "InvalidArgument", "head sizes differ", "gg.flash_attn_ext(e['{dev}q4'], e['{dev}kbad'], e['{dev}v'])")
case("flash_attn heads", "InvalidArgument", "not multiples", "gg.flash_attn_ext(e['{dev}q3'], e['{dev}k'], e['{dev}v'])")
case("flash_attn f32 mask", "InvalidType", "mask must be f16", "gg.flash_attn_ext(e['{dev}q4'], e['{dev}k'], e['{dev}v'], e['{dev}m32'])")
case("flash_attn bias without mask", "InvalidArgument", "max_bias needs a mask", "gg.flash_attn_ext(e['{dev}q4'], e['{dev}k'], e['{dev}v'], max_bias=1.0)")
case("flash_attn v keys", "InvalidArgument", "does not match k", "gg.flash_attn_ext(e['{dev}q4'], e['{dev}k'], e['{dev}vbad'])")
case("flash_attn int q", "InvalidType", "needs float", "gg.flash_attn_ext(e['{dev}ia'], e['{dev}k'], e['{dev}v'])")
case("flash_attn string scale", "InvalidType", "scale must be a number", "gg.flash_attn_ext(e['{dev}q4'], e['{dev}k'], e['{dev}v'], scale='1')")
for what, arg in (("stride", "stride=0"), ("negative stride", "stride=-1"), ("dilation", "dilation=0"),
                  ("padding", "padding=-1"), ("float stride", "stride=1.5"), ("string stride", "stride='1'"),
                  ("triple stride", "stride=(1, 1, 1)")):
    exc = "InvalidType" if what.startswith(("float", "string", "triple")) else "InvalidArgument"
    pat = "stride|must be an int" if exc == "InvalidType" else "must be positive|non-negative"
    case(f"conv_2d bad {what}", exc, pat, f"gg.conv_2d(e['{{dev}}ker'], e['{{dev}}img'], {arg})")
    case(f"im2col bad {what}", exc, pat, f"gg.im2col(e['{{dev}}ker'], e['{{dev}}img'], {arg})")
case("conv_2d channels", "InvalidArgument", "input channels", "gg.conv_2d(e['{dev}ker3'], e['{dev}img'])")
case("conv_2d kernel too big", "InvalidArgument", "smaller than the kernel", "gg.conv_2d(e['{dev}bigker'], e['{dev}img'])")
case("conv_2d int kernel", "InvalidType", "needs float", "gg.conv_2d(e['{dev}ia'], e['{dev}img'])")
case("conv_1d channels", "InvalidArgument", "differ in input channels", "gg.conv_1d(e['{dev}ker1'], e['{dev}sig3'])")
case("conv_1d zero stride", "InvalidArgument", "must be positive", "gg.conv_1d(e['{dev}ker1'], e['{dev}sig'], 0)")
case("im2col f64 dtype", "InvalidType", "dtype must be f32 or f16", "gg.im2col(e['{dev}ker'], e['{dev}img'], dtype='f64')")
case("pool_2d kernel 0", "InvalidArgument", "must be positive", "gg.pool_2d(e['{dev}img'], 0)")
case("pool_2d padding >= kernel", "InvalidArgument", "padding in 0..kernel-1", "gg.pool_2d(e['{dev}img'], 2, padding=2)")
case("pool_2d too big", "InvalidArgument", "smaller than the kernel", "gg.pool_2d(e['{dev}img'], 9)")
case("pool_2d op min", "InvalidArgument", "op must be", "gg.pool_2d(e['{dev}img'], 2, op='min')")
case("pool_2d op int", "InvalidArgument", "op must be", "gg.pool_2d(e['{dev}img'], 2, op=0)")
case("pool_2d f16", "InvalidType", "takes f32", "gg.pool_2d(e['{dev}h'], 2)")

# -- types ---------------------------------------------------------------------------------
for op in UNARY:
    case(f"{op} of i32", "InvalidType", "needs float tensors", f"gg.{op}(e['{{dev}}ia'])")
for op in BINARY:
    case(f"gg.{op} of i32", "InvalidType", "needs float tensors", f"gg.{op}(e['{{dev}}ia'], e['{{dev}}ia'])")
    case(f"gg.{op} shapes", "InvalidArgument", "does not repeat into", f"gg.{op}(e['{{dev}}a'], e['{{dev}}sq'])")
    case(f"gg.{op} mixed f16 with i32", "InvalidType", "needs float", f"gg.{op}(e['{{dev}}h'], e['{{dev}}ia'])")
for op in F32_ONLY:
    case(f"{op} of f16", "InvalidType", "f32|compute", f"gg.{op}(e['{{dev}}h'])")
case("mul_mat f64 weights", "InvalidType", "a must be f32/f16/bf16", "gg.mul_mat(e['{dev}d'], e['{dev}a'])")
case("mul_mat i32 b", "InvalidType", "b must be a float", "gg.mul_mat(e['{dev}a'], e['{dev}ia'])")
case("out_prod f16 b", "InvalidType", "b must be f32", "gg.out_prod(e['{dev}a'], e['{dev}h'])")
case("cpy i32 to f16", "InvalidType", "does not convert", "gg.cpy(e['{dev}ia'], e['{dev}h'])")
case("cpy count", "InvalidArgument", "elements into", "gg.cpy(e['{dev}a'], e['{dev}sq'])")
case("concat types", "InvalidType", "types differ", "gg.concat(e['{dev}a'], e['{dev}h'], 0)")
case("get_rows f32 indices", "InvalidType", "indices must be i32", "gg.get_rows(e['{dev}a'], e['{dev}a'])")
case("get_rows f64 table", "InvalidType", "reads rows of", "gg.get_rows(e['{dev}d'], e['{dev}idx'])")
case("set_rows f64 src", "InvalidType", "set_rows: ggml's kernels compute .*, not f64", "gg.set_rows(e['{dev}d'], e['{dev}d'], e['{dev}idx'])")
case("set_rows f32 indices", "InvalidType", "indices must be i32 or i64", "gg.set_rows(e['{dev}sq'], e['{dev}sq'], e['{dev}sq'])")
case("scale of i32", "InvalidType", "compute", "e['{dev}ia'] * 2.0")
case("scalar plus i32", "InvalidType", "compute", "e['{dev}ia'] + 1")
case("rdiv of f16", "InvalidType", "fills f32", "1.0 / e['{dev}h']")
case("unknown type name", "InvalidType", "unknown ggml type|not a ggml type", "e['ctx'].tensor('f128', 4)")
case("type number", "InvalidType", "not a ggml type", "e['ctx'].tensor(999, 4)")
case("object dtype", "InvalidType", "not a ggml type|object", "e['ctx'].from_numpy(np.array([1, 'a'], object))")
case("quantized row length", "InvalidArgument", "block size", "e['ctx'].tensor(gg.q4_0, (2, 30))")

# -- shapes and indexing -------------------------------------------------------------------
for shape, exc, pat in (("(2.5, 3)", "InvalidType", "must be an int"), ("'12'", "InvalidType", "must be an int"),
                        ("()", "InvalidArgument", "1 to 4 axes"), ("(0, 3)", "InvalidArgument", ">= 1"),
                        ("(-1,)", "InvalidArgument", ">= 1"), ("(1, 1, 1, 1, 1)", "InvalidArgument", "1 to 4 axes"),
                        ("(1 << 40, 1 << 40)", "OutOfMemory", "more elements"), ("None", "InvalidType", "must be an int"),
                        ("[True, 2]", "InvalidType", "not a bool"), ("(np.float32(2),)", "InvalidType", "must be an int"),
                        ("b'12'", "InvalidType", "must be an int")):
    case(f"tensor shape {shape}", exc, pat, f"e['ctx'].tensor(gg.f32, {shape})")
for shape, exc, pat in (("(5, 5)", "InvalidArgument", "cannot reshape"), ("(4.0, 8)", "InvalidType", "must be an int"),
                        ("('4', 8)", "InvalidType", "must be an int"), ("(-1, -1)", "InvalidArgument", "cannot reshape"),
                        ("(0, 32)", "InvalidArgument", "bad shape"), ("(1, 1, 1, 4, 8)", "InvalidArgument", "bad shape"),
                        ("'32'", "InvalidType", "shape must be ints")):
    case(f"reshape {shape}", exc, pat, f"e['{{dev}}a'].reshape({shape})")
for args, exc, pat in (("(4, 8), offset=8", "InvalidArgument", "runs past"), ("(4,), offset=-4", "InvalidArgument", "runs past"),
                       ("(4,), offset=4.0", "InvalidType", "offset must be an int"), ("(64,)", "InvalidArgument", "runs past"),
                       ("(2, 2), strides=(8, 8)", "InvalidArgument", "last stride"), ("(2, 2), strides=(4,)", "InvalidArgument", "strides for"),
                       ("(2, 2), strides=(-4, 4)", "InvalidArgument", "positive"), ("(2, 2), strides='ab'", "InvalidType", "strides must be ints"),
                       ("(2.0, 2)", "InvalidType", "must be an int")):
    case(f"view {args}", exc, pat, f"e['{{dev}}a'].view({args})")
for axes, exc, pat in (("(0, 0)", "InvalidArgument", "not a permutation"), ("(0,)", "InvalidArgument", "not a permutation"),
                       ("(0, 1, 2)", "InvalidArgument", "not a permutation"), ("(0.0, 1)", "InvalidType", "must be an int"),
                       ("'01'", "InvalidType", "axes must be ints"), ("5", "InvalidType", "sequence of ints")):
    case(f"permute {axes}", exc, pat, f"e['{{dev}}a'].permute({axes})")
for shape, exc, pat in (("(5, 8)", "InvalidArgument", "does not tile"), ("(8,)", "InvalidArgument", "fewer axes"),
                        ("(8.0, 8)", "InvalidType", "must be an int")):
    case(f"repeat {shape}", exc, pat, f"gg.repeat(e['{{dev}}a'], {shape})")
for args, exc, pat in (("e['{dev}a'], e['{dev}c'], 0", "InvalidArgument", "differ off axis"),
                       ("e['{dev}a'], e['{dev}a'], 2", "InvalidArgument", "out of range"),
                       ("e['{dev}a'], e['{dev}a'], 1.0", "InvalidType", "axis must be an int"),
                       ("e['{dev}a'], e['{dev}img'], 0", "InvalidArgument", "-D and")):
    case(f"concat {args[-4:]} {pat}", exc, pat, f"gg.concat({args})")
for w, exc, pat in (("[-1, 0]", "InvalidArgument", "non-negative"), ("[1]", "InvalidArgument", "widths for"),
                    ("'ab'", "InvalidType", "widths must be"), ("[1.5, 0]", "InvalidType", "must be an int"),
                    ("[(1, 2, 3), 0]", "InvalidArgument", "pairs")):
    case(f"pad {w}", exc, pat, f"gg.pad(e['{{dev}}a'], {w})")
case("get_rows index shape", "InvalidArgument", "does not fit", "gg.get_rows(e['{dev}img'], e['{dev}pos'])")
case("get_rows table batch", "InvalidArgument", "does not fit", "gg.get_rows(e['{dev}tables'], e['{dev}idx'])")
case("set_rows width", "InvalidArgument", "do not fit", "gg.set_rows(e['{dev}sq'], e['{dev}a'][:0] if False else e['{dev}c'], e['{dev}idx'])")
case("matmul not aligned", "InvalidArgument", "not aligned", "e['{dev}a'] @ e['{dev}a']")
case("matmul batch", "InvalidArgument", "do not broadcast", "e['{dev}img'] @ e['{dev}cube3']")
case("operator shapes", "InvalidArgument", "do not broadcast", "e['{dev}a'] + e['{dev}c']")
case("mul_mat inner", "InvalidArgument", "inner dims differ", "gg.mul_mat(e['{dev}a'], e['{dev}c'])")
case("mul_mat batch", "InvalidArgument", "batch dims", "gg.mul_mat(e['{dev}img'], e['{dev}cube'])")
case("argmax 3-D", "InvalidArgument", "takes a matrix", "gg.argmax(e['{dev}cube'])")

# -- argument kinds -------------------------------------------------------------------------
for op in UNARY[:6]:
    case(f"{op} of a float", "InvalidType", "must be a Tensor", f"gg.{op}(1.0)")
    case(f"{op} of an array", "InvalidType", "must be a Tensor", f"gg.{op}(np.ones(4, np.float32))")
for op in BINARY:
    case(f"gg.{op} scalar b", "InvalidType", "b must be a Tensor", f"gg.{op}(e['{{dev}}a'], 2.0)")
    case(f"gg.{op} None a", "InvalidType", "a must be a Tensor", f"gg.{op}(None, e['{{dev}}a'])")
case("operator with a string", "TypeError", "unsupported operand", "e['{dev}a'] + 'x'")
# a list is an array-like: a constant operand under numpy's broadcasting rules (issue 32)
case("operator with a list", "InvalidArgument", "do not broadcast", "e['{dev}a'] * [1, 2]")
case("matmul with a scalar", "TypeError", "unsupported operand", "e['{dev}a'] @ 2.0")
case("tensor name NUL", "InvalidArgument", "NUL", "e['ctx'].tensor(gg.f32, 4, 'a\\0b')")
case("tensor name too long", "InvalidArgument", "shorter than", "e['ctx'].tensor(gg.f32, 4, 'x' * 100)")
case("tensor name bytes", "InvalidType", "name must be a str", "e['ctx'].tensor(gg.f32, 4, b'x')")
case("rename NUL", "InvalidArgument", "NUL", "setattr(e['{dev}a'], 'name', 'a\\0')")
case("rename int", "InvalidType", "name must be a str", "setattr(e['{dev}a'], 'name', 5)")
for cap, exc, pat in (("0", "InvalidArgument", "capacity must be in"), ("-1", "InvalidArgument", "capacity must be in"),
                      ("1.5", "InvalidType", "capacity must be an int"), ("'8'", "InvalidType", "capacity must be an int"),
                      ("1 << 40", "InvalidArgument", "capacity must be in"), ("True", "InvalidType", "not a bool")):
    case(f"Context capacity {cap}", exc, pat, f"gg.Context({cap})")
for n, exc, pat in (("1.5", "InvalidType", "nbytes must be an int"), ("-1", "InvalidArgument", ">= 0"),
                    ("'8'", "InvalidType", "nbytes must be an int"), ("True", "InvalidType", "nbytes must be an int"),
                    ("1 << 70", "OutOfMemory", "exceed|could not"), ("None", "InvalidType", "nbytes must be an int")):
    case(f"{{dev}} buffer alloc {n}", exc, pat, f"e['{{dev}}dev'].buffer_type.alloc({n})")
for v in ("256", "-1", "1.5", "'a'", "True"):
    case(f"buffer clear {v}", "InvalidArgument", "must be a byte", f"e['buf'].clear({v})")
case("buffer usage", "InvalidArgument", "usage must be one of", "setattr(e['buf'], 'usage', 'gpu')")
for n, exc, pat in (("0", "InvalidArgument", "n_threads must be"), ("-2", "InvalidArgument", "n_threads must be"),
                    ("1.5", "InvalidArgument", "n_threads must be"), ("True", "InvalidArgument", "n_threads must be"),
                    ("10 ** 6", "InvalidArgument", "n_threads must be")):
    case(f"n_threads {n}", exc, pat, f"setattr(e['cpube'], 'n_threads', {n})")
case("backend params NUL", "InvalidArgument", "NUL", "e['cpudev'].backend(params='a\\0b')")
case("backend params int", "InvalidType", "params must be a str", "e['cpudev'].backend(params=3)")
case("alloc with a string", "InvalidType", "takes a Backend or a BufferType", "e['ctx'].alloc('CPU')")
for key, exc, pat in (("'GPU7'", "NotFound", "no device named"), ("42", "NotFound", "no device 42"),
                      ("1.5", "InvalidArgument", "name or an index"), ("True", "InvalidArgument", "name or an index"),
                      ("None", "InvalidArgument", "name or an index"), ("b'CPU'", "InvalidArgument", "name or an index")):
    case(f"device lookup {key}", exc, pat, f"gg.device({key})")
case("device type unknown", "InvalidArgument", "unknown device type", "gg.device(type='quantum')")
case("device name and type", "InvalidArgument", "not both", "gg.device('CPU', type='cpu')")

# -- data in and out -------------------------------------------------------------------------
for what, code, exc, pat in (
        ("dtype", "{t}.set(np.ones((4, 8), np.float64))", "InvalidType", "does not match"),
        ("size", "{t}.set(np.ones((4, 9), np.float32))", "InvalidArgument", "elements"),
        ("past the end", "{t}.set(np.ones(40, np.uint8), offset=100, flat=True)", "InvalidArgument", "run past"),
        ("negative offset", "{t}.set(np.ones(4, np.uint8), offset=-1, flat=True)", "InvalidArgument", "offset must be >= 0"),
        ("float offset", "{t}.set(np.ones(4, np.uint8), offset=1.0, flat=True)", "InvalidType", "offset must be an int"),
        ("non-contiguous", "{t}.set(np.ones((8, 4), np.float32).T)", "InvalidArgument", "not C-contiguous"),
        ("a list", "{t}.set([1.0] * 32)", "InvalidType", "expected a numpy array"),
        ("None", "{t}.set(None)", "InvalidType", "expected a numpy array"),
        ("objects", "{t}.set(np.array([None] * 32, object))", "InvalidType", "does not match|object"),
        ("get size", "{be}.get({t}, np.empty(31, np.float32))", "InvalidArgument", "elements"),
        ("get read-only", "{be}.get({t}, np.broadcast_to(np.float32(0), (4, 8)))", "InvalidArgument", "read-only|C-contiguous"),
        ("get dtype", "{be}.get({t}, np.empty((4, 8), np.int32))", "InvalidType", "does not match"),
        ("set_async dtype", "{be}.set_async({t}, np.ones((4, 8), np.int32))", "InvalidType", "does not match"),
        ("set_async past end", "{be}.set_async({t}, np.ones(64, np.uint8), offset=120, flat=True)", "InvalidArgument", "run past"),
        ("get_async non-contiguous", "{be}.get_async({t}, np.empty((8, 4), np.float32).T)", "InvalidArgument", "not C-contiguous"),
        ("numpy copy string", "{t}.numpy(copy='yes')", "InvalidType", "copy must be None or a bool"),
        ("set unallocated", "e['u'].set(np.ones(4, np.float32))", "InvalidArgument", "has no memory"),
        ("numpy unallocated", "e['u'].numpy()", "InvalidArgument", "has no memory"),
        ("copy shapes", "gg.copy_async({t}, e['{dev}sq'], {be}, {be})", "InvalidArgument", "shapes differ"),
        ("copy types", "gg.copy_async({t}, e['{dev}h'], {be}, {be})", "InvalidType", "types differ"),
        ("copy same tensor", "gg.copy_async({t}, {t}, {be}, {be})", "InvalidArgument", "same tensor"),
        ("copy non-tensor", "gg.copy_async({t}, 1.0, {be}, {be})", "InvalidType", "dst must be a Tensor"),
        ("copy non-backend", "gg.copy_async({t}, e['{dev}b'], 'be', {be})", "InvalidType", "must be a Backend"),
        ("blocking copy types", "gg.copy({t}, e['{dev}h'])", "InvalidArgument", "differ in type"),
        ("compute a non-graph", "{be}.compute({t})", "InvalidArgument", "expected a gg.Graph"),
        ("compute unallocated", "{be}.compute(gg.Graph(e['u'] + e['u']))", "InvalidArgument", "has no memory"),
):
    case(f"{what}", exc, pat, code.replace("{t}", "e['{dev}a']").replace("{be}", "e['{dev}be']"))
case("set_async other device", "InvalidArgument", "another device", "e['rpcbe'].set_async(e['cpua'], np.ones((4, 8), np.float32))")
case("compute on the wrong device", "InvalidArgument", "cannot use", "e['rpcbe'].compute(gg.Graph(e['cpua'] + e['cpua']))")
case("buffer_from_host read-only", "InvalidArgument", "read-only", "e['cpudev'].buffer_from_host(np.frombuffer(bytes(256), np.uint8))")
case("buffer_from_host unaligned", "InvalidArgument", "not aligned", "e['cpudev'].buffer_from_host(gg.aligned_empty(65, np.uint8)[1:])")
case("buffer_from_host list", "InvalidType", "expected a numpy array", "e['cpudev'].buffer_from_host([1, 2])")
case("buffer_from_host strided", "InvalidArgument", "C-contiguous", "e['cpudev'].buffer_from_host(gg.aligned_empty((8, 8))[:, ::2])")
case("from_dlpack of a non-array", "InvalidType", "DLPack producer", "gg.from_dlpack(object(), e['ctx'])")
case("from_dlpack into a non-context", "InvalidType", "Context", "gg.from_dlpack(np.ones(4), 'ctx')")

# -- class 3: lifetimes ----------------------------------------------------------------------
for op in ("relu", "neg", "sum", "cont"):
    case(f"{op} of a closed context's tensor", "ClosedError", "context is closed", f"gg.{op}(e['z'])")
for what, code in (("numpy", "e['z'].numpy()"), ("set", "e['z'].set(np.ones(4, np.float32))"),
                   ("shape", "e['z'].shape"), ("op", "e['z'].op"), ("name", "e['z'].name"),
                   ("graph", "gg.Graph(e['z'])"), ("operator", "e['z'] + 1.0"), ("reshape", "e['z'].reshape(2, 2)")):
    case(f"closed context {what}", "ClosedError", "closed", code)
for what, code in (("set", "e['closedbe'].set(e['cpua'], np.ones((4, 8), np.float32))"),
                   ("compute", "e['closedbe'].compute(gg.Graph(e['cpua'] + e['cpua']))"),
                   ("synchronize", "e['closedbe'].synchronize()"), ("name", "e['closedbe'].name"),
                   ("n_threads", "e['closedbe'].n_threads"), ("with", "e['closedbe'].__enter__()"),
                   ("scheduler", "gg.Scheduler([e['closedbe']])")):
    case(f"closed backend {what}", "ClosedError", "closed", code)
for what, code in (("size", "e['closedbuf'].size"), ("clear", "e['closedbuf'].clear(0)"), ("base", "e['closedbuf'].base"),
                   ("tensors of a closed buffer", "e['lost'].numpy()")):
    case(f"closed buffer {what}", "ClosedError|InvalidArgument", "closed|has no memory", code)
case("graph over a closed context", "ClosedError", "context holding tensors", "e['cpube'].compute(e['zg'])")
case("graph nodes after close", "ClosedError", "context holding tensors", "e['zg'].nodes")
case("closed event", "ClosedError", "closed", "e['closedev'].synchronize()")
for what, code in (("copy tensor", "__import__('copy').copy(e['cpua'])"), ("deepcopy tensor", "__import__('copy').deepcopy(e['cpua'])"),
                   ("pickle tensor", "__import__('pickle').dumps(e['cpua'])"), ("copy context", "__import__('copy').copy(e['ctx'])"),
                   ("pickle backend", "__import__('pickle').dumps(e['cpube'])"), ("copy buffer", "__import__('copy').copy(e['buf'])"),
                   ("pickle device", "__import__('pickle').dumps(e['cpudev'])"), ("copy graph", "__import__('copy').copy(e['g'])")):
    case(what, "TypeError", "cannot be (copied|pickled)", code)

# -- events, graphs, schedulers ----------------------------------------------------------------
case("event on the CPU", "UnsupportedError", "has no events", "e['cpudev'].event()")
case("record on another device", "InvalidArgument", "cannot be recorded", "e['rpcev'].record(e['cpube'])")
case("record on a non-backend", "InvalidType", "expected a Backend", "e['rpcev'].record('be')")
case("wait on a non-event", "InvalidType", "expected an Event", "e['rpcbe'].wait('ev')")
case("wait on the CPU", "UnsupportedError", "has no events", "e['cpube'].wait(e['rpcev'])")
case("empty graph", "InvalidType", "non-empty list", "gg.Graph([])")
case("graph of floats", "InvalidType", "non-empty list", "gg.Graph([1.0])")
case("graph of an array", "InvalidType", "non-empty list", "gg.Graph(np.ones(3))")
case("graph capacity small", "InvalidArgument", "cannot hold", "gg.Graph(e['cpua'] + e['cpua'], capacity=1)")
case("graph capacity float", "InvalidType", "capacity must be an int", "gg.Graph(e['cpua'] + e['cpua'], capacity=64.0)")
case("graph capacity huge", "InvalidArgument", "at most", "gg.Graph(e['cpua'] + e['cpua'], capacity=1 << 40)")
case("scheduler empty", "InvalidType", "list of Backend", "gg.Scheduler([])")
case("scheduler not a list", "InvalidType", "list of Backend", "gg.Scheduler(e['cpube'])")
case("scheduler non-cpu last", "InvalidArgument", "must be on a CPU", "gg.Scheduler([e['cpube'], e['rpcbe']])")
case("scheduler twice", "InvalidArgument", "listed twice", "gg.Scheduler([e['cpube'], e['cpube']])")
case("scheduler graph_size 0", "InvalidArgument", "graph_size must be", "gg.Scheduler([e['cpube']], graph_size=0)")
case("scheduler graph_size float", "InvalidArgument", "graph_size must be", "gg.Scheduler([e['cpube']], graph_size=1.5)")
case("scheduler compute a tensor", "InvalidType", "expected a gg.Graph", "e['sched'].compute(e['cpua'])")
case("scheduler unallocated input", "InvalidArgument", "set_input", "e['sched'].compute(gg.Graph(e['u'] + e['u']))")
case("scheduler foreign pin", "InvalidArgument", "not one of", "e['sched'].set_backend(e['cpua'], e['rpcbe'])")
case("get_rows index out of range at compute", "InvalidArgument", "out of range", "e['{dev}be'].compute(e['{dev}badrows'])")

# -- class 8: RPC endpoints and servers --------------------------------------------------------
for ep in ("'localhost'", "'localhost:'", "':50052'", "'127.0.0.1:0'", "'127.0.0.1:65536'", "'127.0.0.1:99999999999'",
           "'127.0.0.1:-1'", "'127.0.0.1:5e3'", "'127.0.0.1:１２３'", "'127.0.0.1: 80'", "'127.0.0.1:80\\0'",
           "'héllo:80'", "''"):
    case(f"connect {ep}", "InvalidArgument", "endpoint|port", f"gg.rpc.connect({ep})")
case("connect an int", "InvalidType", "host:port", "gg.rpc.connect(50052)")
case("connect nothing listening", "RPCError", "no RPC server reachable", "gg.rpc.connect('127.0.0.1:' + str(e['freeport']), timeout=1)")
case("hello garbage endpoint", "InvalidArgument", "port", "gg.rpc.hello('127.0.0.1:http')")
case("serve port in use", "RPCError", "in use", "gg.rpc.serve(port=e['usedport'])")
case("serve bad port", "InvalidArgument", "port must be", "gg.rpc.serve(port=70000)")
case("serve float port", "InvalidArgument", "port must be", "gg.rpc.serve(port=1.5)")
case("serve threads 0", "InvalidArgument", "threads must be", "gg.rpc.serve(threads=0)")
case("serve threads huge", "InvalidArgument", "threads must be", "gg.rpc.serve(threads=10 ** 6)")
case("serve remote without consent", "InvalidArgument", "allow_remote", "gg.rpc.serve(host='0.0.0.0')")
case("serve unknown device", "NotFound", "no device named", "gg.rpc.serve('GPU9')")

DEVICES = ("cpu", "rpc")


def expanded() -> dict[str, tuple[str, str, str]]:
    """Every case, with those naming ``{dev}`` once per device kind."""
    out = {}
    for name, (exc, pat, code) in CASES.items():
        if "{dev}" in code or "{dev}" in name:
            for d in DEVICES:
                out[f"{d}: {name.replace('{dev}', d)}"] = (exc, pat, code.replace("{dev}", d))
        else:
            out[name] = (exc, pat, code)
    return out


# -- the child process -----------------------------------------------------------------------
def environment(gg, np):  # noqa: ANN001, ANN201 (a test helper run in the child)
    import socket
    e = {}
    srv = gg.rpc.serve()
    e["server"] = srv
    e["cpudev"] = gg.device("CPU")
    e["rpcdev"] = gg.rpc.connect(srv.endpoint).devices[0]
    for kind in DEVICES:
        dev = e[f"{kind}dev"]
        be = dev.backend()
        ctx = gg.Context()
        t = {"a": ctx.tensor(gg.f32, (4, 8)), "b": ctx.tensor(gg.f32, (4, 8)),
             "c": ctx.tensor(gg.f32, (3, 5)), "sq": ctx.tensor(gg.f32, (8, 8)),
             "cube": ctx.tensor(gg.f32, (2, 8, 8)), "cube3": ctx.tensor(gg.f32, (3, 8, 8)),
             "h": ctx.tensor(gg.f16, (4, 8)), "ia": ctx.tensor(gg.i32, (4, 8)), "d": ctx.tensor(gg.f64, (4, 8)),
             "q": ctx.tensor(gg.q8_0, (4, 32)), "img": ctx.tensor(gg.f32, (1, 4, 8, 8)),
             "heads": ctx.tensor(gg.f32, (1, 6, 2, 8)), "pos": ctx.tensor(gg.i32, (6,)),
             "idx": ctx.tensor(gg.i32, (3,)), "tables": ctx.tensor(gg.f32, (2, 1, 6, 8)),
             "ker": ctx.tensor(gg.f32, (2, 4, 3, 3)), "ker3": ctx.tensor(gg.f32, (2, 3, 3, 3)),
             "bigker": ctx.tensor(gg.f32, (2, 4, 9, 9)), "ker1": ctx.tensor(gg.f32, (2, 4, 3)),
             "sig": ctx.tensor(gg.f32, (1, 4, 10)), "sig3": ctx.tensor(gg.f32, (1, 3, 10)),
             "q4": ctx.tensor(gg.f32, (1, 4, 3, 8)), "q3": ctx.tensor(gg.f32, (1, 3, 3, 8)),
             "k": ctx.tensor(gg.f16, (1, 2, 5, 8)), "kbad": ctx.tensor(gg.f16, (1, 2, 5, 4)),
             "v": ctx.tensor(gg.f16, (1, 2, 5, 8)), "vbad": ctx.tensor(gg.f16, (1, 2, 4, 8)),
             "m32": ctx.tensor(gg.f32, (3, 5)), "table": ctx.tensor(gg.f32, (6, 8)),
             "bad_idx": ctx.tensor(gg.i32, (2,))}
        ctx.alloc(be)
        t["bad_idx"].set(np.array([1, 6], np.int32))
        t["badrows"] = gg.Graph(gg.get_rows(t["table"], t["bad_idx"]))
        for k, v in t.items():
            e[kind + k] = v
        e[kind + "be"] = be
        e[kind + "ctx"] = ctx
    e["ctx"] = gg.Context()
    e["u"] = e["ctx"].tensor(gg.f32, (4,))
    zctx = gg.Context()
    e["z"] = zctx.tensor(gg.f32, (4,))
    e["zg"] = gg.Graph(e["cpua"] + e["z"].reshape(4) if False else e["z"] + e["z"])
    zctx.close()
    closedbe = e["cpudev"].backend()
    closedbe.close()
    e["closedbe"] = closedbe
    e["buf"] = e["cpudev"].buffer_type.alloc(256)
    closedbuf = e["cpudev"].buffer_type.alloc(64)
    closedbuf.close()
    e["closedbuf"] = closedbuf
    lctx = gg.Context()
    e["lost"] = lctx.tensor(gg.f32, (4,))
    lctx.alloc(e["cpube"])[0].close()
    e["lctx"] = lctx
    if e["rpcdev"].caps.events:         # RPC events arrived in ggml 0.23.0
        e["rpcev"] = e["rpcdev"].event()
        closedev = e["rpcdev"].event()
        closedev.close()
        e["closedev"] = closedev
    e["g"] = gg.Graph(e["cpua"] + e["cpua"])
    e["sched"] = gg.Scheduler([e["cpube"]])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        e["freeport"] = s.getsockname()[1]
    e["usedport"] = int(srv.endpoint.rpartition(":")[2])

    def check():
        for kind in DEVICES:
            x = e[kind + "b"]
            x.set(np.full((4, 8), 2.0, np.float32))
            out = x + x
            e[kind + "be"].compute(gg.Graph(out))
            assert out.numpy(copy=True)[0, 0] == 4.0, kind
    e["check"] = check
    return e


def main() -> None:
    import builtins

    import numpy as np
    import ggml_py as gg
    cases = expanded()
    e = environment(gg, np)
    print("READY", flush=True)
    for line in sys.stdin:
        name = line.rstrip("\n")
        exc, pat, code = cases[name]
        missing = [k for k in ("rpcev", "closedev") if f"e['{k}']" in code and k not in e]
        if missing:
            print(f"SKIP needs RPC events, which arrived in ggml 0.23.0 (this build is "
                  f"{gg.ggml_version()})\t{name}", flush=True)
            continue
        wanted = tuple(getattr(gg, n) if hasattr(gg, n) else getattr(builtins, n)
                       for n in exc.split("|"))
        try:
            eval(code, {"gg": gg, "np": np, "e": e})
        except wanted as err:
            msg = str(err)
            if not isinstance(err, (gg.GGMLError, TypeError)):
                status = f"WRONG not a GGMLError: {type(err).__name__}: {msg}"
            elif not re.search(pat, msg):
                status = f"WRONG message {type(err).__name__}: {msg!r} does not match {pat!r}"
            else:
                status = "OK"
        except BaseException as err:  # noqa: BLE001 (reported, not swallowed)
            status = f"WRONG raised {type(err).__name__}: {err}"
        else:
            status = "WRONG accepted silently"
        try:
            e["check"]()
        except BaseException as err:  # noqa: BLE001
            status += f" / BROKEN AFTER: {type(err).__name__}: {err}"
        print(f"{status}\t{name}", flush=True)


if __name__ == "__main__":
    main()
