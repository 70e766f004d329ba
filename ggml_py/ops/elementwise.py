"""Elementwise ops: ggml's binary ops with ggml's "repeat" broadcasting, scalar ops, unary
functions.

Kernel rules (0.25.3, ggml-cpu/binary-ops.cpp and unary-ops.cpp): the first operand's rows
must be packed (``nb[0]`` is the element size), the second must repeat into the first, and
the unary kernels need packed rows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .._loader import lib
from ..errors import InvalidArgument, InvalidType, UnsupportedError
from ._common import (CPU_TYPES, build, can_repeat, contiguous, cpu_type, float_of, floats, need, rows,
                      scalable, tensor)

if TYPE_CHECKING:
    from .._tensor import Tensor


def _binary(fn: Callable[..., Any], a: Any, b: Any, name: str) -> Tensor:
    a, b = tensor(a, name, "a"), tensor(b, name, "b")
    floats(name, a, b)
    # (plain ifs: these checks run per op while graphs are built, messages only on failure)
    if not can_repeat(b, a):
        raise InvalidArgument(f"{name}: b {b.shape} does not repeat into a {a.shape} "
                              "(each ggml dim of b must divide a's)")
    if a.type != b.type and b.type.name != "f32":
        raise InvalidType(f"{name}: mixed types {a.type.name} and {b.type.name}")
    rows(name, ("a", a))
    return build(a, fn, a.ptr, b.ptr, ndim=max(a.ndim, b.ndim), uses=(b,), like=a)


def add(a: Tensor, b: Tensor) -> Tensor:
    """ggml_add: a + b, with b repeated (tiled) into a's shape."""
    return _binary(lib.ggml_add, a, b, "add")


def sub(a: Tensor, b: Tensor) -> Tensor:
    """ggml_sub: a - b, with b repeated into a's shape."""
    return _binary(lib.ggml_sub, a, b, "sub")


def mul(a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul: a * b elementwise, with b repeated into a's shape."""
    return _binary(lib.ggml_mul, a, b, "mul")


def div(a: Tensor, b: Tensor) -> Tensor:
    """ggml_div: a / b elementwise, with b repeated into a's shape."""
    return _binary(lib.ggml_div, a, b, "div")


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


def _unary(fn_name: str, name: str) -> Callable[[Tensor], Tensor]:
    fn = getattr(lib, fn_name, None)

    def op(a: Tensor) -> Tensor:
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
