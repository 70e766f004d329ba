"""Elementwise ops: ggml's binary ops with ggml's "repeat" broadcasting, scalar ops, unary
functions.

Kernel rules (0.25.3, ggml-cpu/binary-ops.cpp and unary-ops.cpp): the first operand's rows
must be packed (``nb[0]`` is the element size), the second must repeat into the first, and
the unary kernels need packed rows.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._loader import ffi, lib
from .._tensor_base import TensorBase
from ..errors import InvalidArgument, InvalidType, UnsupportedError, require
from ._common import (BinaryOp, Tensor, UnaryOp, CHECKED_OPS, CPU_TYPES, FLOAT_MASK, FLOAT_TYPES,
                      cpu_mask, MAX_DIMS, build, can_repeat, contiguous, cpu_type, float_of,
                      floats, need, rows, rule, scalable, tensor)
from .shape import cont, repeat



def _packed(t: Tensor) -> Tensor:
    """`t`, or a contiguous copy when its rows are strided (numpy semantics take any layout)."""
    tt = t.type
    return t if tt.block_size > 1 or t.nb[0] == tt.type_size else cont(t)


def _broadcast(a: Tensor, b: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """(a', b') with numpy broadcasting made explicit where ggml's repeat rule needs it: `a`
    packed, then both repeated to the broadcast shape where ggml's repeat cannot tile b."""
    a = _packed(a)
    if a.ne == b.ne:            # (numpy's shape is the one with more axes: ndim says it)
        return a, b
    try:
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise InvalidArgument(f"{name}: shapes {a.shape} and {b.shape} do not broadcast") from None
    require(len(shape) <= MAX_DIMS, f"{name}: the result would have {len(shape)} axes")
    if a.shape != shape:
        a = repeat(a, shape)
    if b.shape != shape and not can_repeat(b, a):
        b = repeat(_packed(b), shape)
    return a, b


# ggml's binary builders as C function pointers, for helpers.c's checked binary op
_FN2 = {n: ffi.addressof(lib, f"ggml_{n}") for n in ("add", "sub", "mul", "div")} if CHECKED_OPS else {}
# helpers.c's checked ops these functions call (module names: tests/test_checked.py counts
# their calls); None without the helpers
_C_BINARY: Any = CHECKED_OPS.ggml_py_binary if CHECKED_OPS is not None else None
_C_UNARY: Any = CHECKED_OPS.ggml_py_unary if CHECKED_OPS is not None else None
if CHECKED_OPS is not None:
    CHECKED_OPS.ggml_py_binary_types(FLOAT_MASK)      # (the rule's types, given to C once)


def binary(fn: Callable[..., Any], a: Any, b: Any, name: str, numpy: bool = False) -> TensorBase:
    """ggml's binary op `fn` (ggml_add...) on `a` and `b`: the one place of the rule of
    gg.add/sub/mul/div and of the operators ``+ - * /`` (`numpy`: numpy's broadcasting made
    explicit first, a strided `a` copied).

    The Python path of :func:`binary_op` (its common case is one checked call): the rule
    reads the facts each tensor caches (shape, type, strides: read from ggml once, or given by
    the op that made the tensor); the result is built the one way every op's is
    (``Context.build``)."""
    if (not isinstance(a, TensorBase) or not isinstance(b, TensorBase) or a.ctx._raw is None
            or b.ctx._raw is None):
        a, b = tensor(a, name, "a"), tensor(b, name, "b")   # InvalidType / ClosedError
    ta, ne_a, nb_a, nd_a = a._type, a._ne, a._nb, a._ndim
    if ta is None or ne_a is None or nb_a is None or not nd_a:
        ta, ne_a, nb_a, nd_a = a.type, a.ne, a.nb, a.ndim     # (read from ggml once)
    tb, ne_b, nd_b = b._type, b._ne, b._ndim
    if tb is None or ne_b is None or not nd_b:
        tb, ne_b, nd_b = b.type, b.ne, b.ndim
    same = ne_a == ne_b
    if numpy and (not same or (nb_a[0] != ta._size and ta._block == 1)):
        # numpy semantics: a strided `a` copied, shapes broadcast (ggml's repeat where it
        # cannot tile b); the facts are then those of the new operands
        a, b = _broadcast(a, b, name)
        ta, ne_a, nb_a, nd_a, tb, ne_b, nd_b = a.type, a.ne, a.nb, a.ndim, b.type, b.ne, b.ndim
        same = ne_a == ne_b
    # the rule (plain ifs: they run per op while graphs are built, messages only on failure)
    if ta not in FLOAT_TYPES or tb not in FLOAT_TYPES:
        bad = ta if ta not in FLOAT_TYPES else tb
        raise InvalidType(f"{name}: needs float tensors (f32/f16/bf16), got {bad.name}")
    if not same and (ne_a[0] % ne_b[0] or ne_a[1] % ne_b[1] or ne_a[2] % ne_b[2]
                     or ne_a[3] % ne_b[3]):
        raise InvalidArgument(f"{name}: b {b.shape} does not repeat into a {a.shape} "
                              "(each ggml dim of b must divide a's)")
    if ta is not tb and ta != tb and tb._name != "f32":
        raise InvalidType(f"{name}: mixed types {ta.name} and {tb.name}")
    if nb_a[0] != ta._size and ta._block == 1:          # a's rows must be packed
        rows(name, ("a", a))
    ctx = a.ctx
    result: TensorBase = ctx.build(fn, (a._p, b._p), nd_a if nd_a >= nd_b else nd_b,
                                   () if b.ctx is ctx else (b,), 1, like=a)
    return result


def binary_op(name: str, numpy: bool, doc: str = "",
              scalar: Callable[[Any, Any], Any] | None = None) -> Callable[[Any, Any], Any]:
    """ggml_<name> (add, sub, mul, div) of `a` and `b`, as gg.add... (`numpy` False: ggml's
    repeat rule) or as Tensor's operators (`numpy` True; `scalar(a, b)` takes a `b` that is no
    tensor). Tensors of one context that pass the rule at once are built in one checked call
    (helpers.c) made in the function itself, as every checked op's is (see _common.CHECKED_OPS):
    these are the calls that build graphs node by node, and a Python frame more costs a tenth
    of one; everything else goes to :func:`binary`."""
    fn = getattr(lib, f"ggml_{name}")
    fast = _FN2.get(name)
    np_flag = 1 if numpy else 0

    def op(a: Any, b: Any) -> Any:
        cls = a.__class__
        if b.__class__ is cls and cls.__base__ is TensorBase and fast is not None:
            ctx = a.ctx
            if b.ctx is ctx:
                # the helper with the context's handle: NULL when refused, closed or full
                p = _C_BINARY(ctx.checked_state, fast, a._p, b._p, np_flag)
                if p:
                    nd, nd_b = a._ndim, b._ndim       # (ints: every tensor is made with one)
                    return cls(p, ctx, nd if nd >= nd_b else nd_b)
        elif scalar is not None and not isinstance(b, TensorBase):
            return scalar(a, b)
        return binary(fn, a, b, name, numpy)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return op


add: BinaryOp = binary_op(
    "add", False, "ggml_add: a + b, with b repeated (tiled) into a's shape.")
sub: BinaryOp = binary_op(
    "sub", False, "ggml_sub: a - b, with b repeated into a's shape.")
mul: BinaryOp = binary_op(
    "mul", False, "ggml_mul: a * b elementwise, with b repeated into a's shape.")
div: BinaryOp = binary_op(
    "div", False, "ggml_div: a / b elementwise, with b repeated into a's shape.")


def scale(a: Tensor, s: float) -> Tensor:
    """ggml_scale: a * s for a Python number s."""
    a = tensor(a, "scale")
    s = float_of(s, "scale: s")
    cpu_type(a, "scale")
    if not scalable(a):
        raise InvalidArgument(f"scale: a {a.shape} must be contiguous (it is a view); use gg.cont(a)")
    return build(a, lib.ggml_scale, a.ptr, s, like=a)


def scale_bias(a: Tensor, s: float, b: float) -> Tensor:
    """ggml_scale_bias: a * s + b for Python numbers s and b."""
    a = tensor(a, "scale_bias")
    s, b = float_of(s, "scale_bias: s"), float_of(b, "scale_bias: b")
    cpu_type(a, "scale_bias", "scale")
    if not scalable(a):
        raise InvalidArgument(f"scale_bias: a {a.shape} must be contiguous (it is a view); "
                              "use gg.cont(a)")
    return build(a, need("ggml_scale_bias", "scale_bias"), a.ptr, s, b)


def fill(a: Tensor, value: float) -> Tensor:
    """ggml_fill: a tensor shaped like `a` with every element `value` (f32)."""
    a = tensor(a, "fill")
    v = float_of(value, "fill: value")
    if a.type.name != "f32":
        raise InvalidType(f"fill: ggml fills f32 tensors, not {a.type.name}")
    if not a.is_contiguous:
        raise InvalidArgument(f"fill: a {a.shape} must be contiguous; use gg.cont(a)")
    return build(a, need("ggml_fill", "fill"), a.ptr, v)


def _unary(fn_name: str, name: str) -> UnaryOp:
    fn = getattr(lib, fn_name, None)
    # the rule below as helpers.c checks it: the float types the kernels compute
    fast = ffi.addressof(lib, fn_name) if CHECKED_OPS is not None and fn is not None else None
    types = rule(cpu_mask(name) if name in CPU_TYPES else FLOAT_MASK)

    def op(a: Tensor) -> Tensor:
        cls = a.__class__
        if cls.__base__ is TensorBase and fast is not None:
            ctx = a.ctx
            p = _C_UNARY(ctx.checked_state, fast, a._p, types)      # the rule below, in C
            if p:
                return cls(p, ctx, a._ndim)
        a = tensor(a, name)
        if fn is None:
            raise UnsupportedError(f"{name} is not in this ggml release")
        floats(name, a)
        if name in CPU_TYPES:
            cpu_type(a, name)
        # the CPU kernels need packed rows, CUDA's (ggml_cuda_op_unary) a contiguous tensor;
        # ggml_is_contiguous ignores axes of length 1, so both are asked
        rows(name, ("a", a))
        contiguous(name, ("a", a))
        return build(a, fn, a.ptr, like=a)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"ggml_{name}(a), elementwise (contiguous float tensors)."
    return op


UNARY = tuple(n for n in ("relu", "gelu", "silu", "tanh", "exp", "sqr", "sqrt", "log", "abs",
                          "neg", "sigmoid", "sin", "cos", "step", "elu", "gelu_quick",
                          "hardswish", "hardsigmoid", "sgn") if hasattr(lib, f"ggml_{n}"))

relu = _unary("ggml_relu", "relu")
gelu = _unary("ggml_gelu", "gelu")
silu = _unary("ggml_silu", "silu")
tanh = _unary("ggml_tanh", "tanh")
exp = _unary("ggml_exp", "exp")
sqr = _unary("ggml_sqr", "sqr")
sqrt = _unary("ggml_sqrt", "sqrt")
log = _unary("ggml_log", "log")
abs = _unary("ggml_abs", "abs")
neg = _unary("ggml_neg", "neg")
sigmoid = _unary("ggml_sigmoid", "sigmoid")
sin = _unary("ggml_sin", "sin")
cos = _unary("ggml_cos", "cos")
step = _unary("ggml_step", "step")
elu = _unary("ggml_elu", "elu")
gelu_quick = _unary("ggml_gelu_quick", "gelu_quick")
hardswish = _unary("ggml_hardswish", "hardswish")
hardsigmoid = _unary("ggml_hardsigmoid", "hardsigmoid")
sgn = _unary("ggml_sgn", "sgn")

__all__ = ["add", "sub", "mul", "div", "scale", "scale_bias", "fill", *UNARY]
