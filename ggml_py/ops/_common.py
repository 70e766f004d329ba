"""What every op builder shares: operand checks, the backends' type rules, and the one path
that builds a result.

The one construction path: :func:`build` asks the context of the operand that owns the result
(the first, unless the op says otherwise) for room, calls the ggml builder there, and wraps the
result in **that** context (``Context.build``). The Python tensor therefore keeps alive the very
context whose memory holds it; operands from other contexts are recorded as that context's
dependencies (for graphs and ``Tensor.src``).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterable, Protocol, TypeVar

from .._loader import HELPERS, lib
from .._types import TYPES
from .._tensor_base import MAX_DIMS, TensorBase, float_of, index_of
from ..errors import InvalidArgument, InvalidType, UnsupportedError, require

#: the class of an op's operands and result, in annotations: ``ggml_py.Tensor`` in every use,
#: named here as a TypeVar bound to TensorBase so that this layer names no class above it (the
#: checked ops build their result as the operand's class; the other paths build it in the
#: owner's context, ``Context.build``, which makes Tensors)
Tensor = TypeVar("Tensor", bound=TensorBase)


class UnaryOp(Protocol):
    """The type of the unary ops made by a factory (``gg.relu``...)."""

    def __call__(self, a: Tensor, /) -> Tensor: ...


class BinaryOp(Protocol):
    """The type of the binary ops made by a factory (``gg.add``...)."""

    def __call__(self, a: Tensor, b: Tensor, /) -> Tensor: ...

FLOAT = ("f32", "f16", "bf16")
FLOAT_TYPES = frozenset(TYPES[n] for n in FLOAT if n in TYPES)     # the same, as GGMLTypes

# Types the backends' kernels compute, per op, where they are fewer than the op's own rules
# allow: ggml's CPU and CUDA backends report these ops as supported for any type and then abort
# in the kernel (0.25.3: ggml-cpu/ops.cpp, ggml-cuda/sum.cu and cpy.cu; tests/test_op_types.py
# checks them). The CPU is every scheduler's fallback, so these are the rule.
CPU_TYPES = {
    "sum": {"f32"}, "scale": {"f32", "bf16"}, "sum_rows": {"f32"}, "mean": {"f32"}, "soft_max": {"f32"},
    "strided copy": {"f32", "f16", "bf16", "i32", "i16"},
    "norm": {"f32"}, "rms_norm": {"f32"}, "group_norm": {"f32"}, "rope_ext": {"f32", "f16"},
    "repeat": {"f32", "f16", "bf16", "i16", "i32", "i64"}, "im2col data": {"f32"},
    "conv kernel": {"f32", "f16"}, "gelu": {"f32", "f16", "bf16"}, "silu": {"f32", "f16", "bf16"},
    "gelu_quick": {"f32", "f16", "bf16"}, "out_prod a": {"f32", "f16", "quantized"},
    "set_rows src": {"f32", "f16"},
}

# (rule, type) -> the first pinned release whose CPU kernels compute it: older releases have
# the op but abort in its kernel on that type (read from each pinned tree's ggml-cpu/ops.cpp)
CPU_TYPES_SINCE = {("scale", "bf16"): (0, 25, 3), ("gelu", "bf16"): (0, 25, 3),
                   ("silu", "bf16"): (0, 25, 3), ("gelu_quick", "bf16"): (0, 25, 3),
                   ("set_rows src", "f16"): (0, 20, 2)}     # (ggml_set_rows asserts it)


def _release() -> tuple[int, ...]:
    from .._loader import BUILD
    try:
        return tuple(int(p) for p in str(BUILD.get("release", "")).split(".")[:3])
    except ValueError:
        return (1 << 30,)          # a local tree (--source): the newest rules


RELEASE = _release()
for (_rule, _type), _since in CPU_TYPES_SINCE.items():
    if RELEASE < _since:
        CPU_TYPES[_rule] = CPU_TYPES[_rule] - {_type}


def type_mask(names: Iterable[str]) -> int:
    """The types named, as the bitmask helpers.c's checked ops take (bit t: enum value t)."""
    m = 0
    for n in names:
        t = TYPES.get(n)
        if t is not None and int(t) < 64:
            m |= 1 << int(t)
    return m


def cpu_mask(rule: str) -> int:
    """type_mask of the types CPU_TYPES allows for `rule` (quantized ones included where it
    says so)."""
    allowed = CPU_TYPES[rule]
    return type_mask(n for n, t in TYPES.items()
                     if n in allowed or ("quantized" in allowed and t.block_size > 1))


#: helpers.c's checked ops: a ggml op built in one call when the operands pass the op's rule,
#: NULL before ggml is called otherwise (also once the context closed or its chunk is full).
#: An op calls its helper itself, with its first operand's context's handle
#: (``Context.checked_state``: the helper builds in that context, under its mutex), only when
#: every tensor operand is of that context and of one class deriving from TensorBase directly
#: (Tensor; a subclass of it takes the Python path), and wraps a result as that class in that
#: same context (``cls(p, ctx, ndim)``, next to the call): the one construction path of a
#: checked op, which names no class above this layer. On NULL the op's Python path runs and decides (it raises ClosedError, opens a
#: chunk, or words the refusal). None for ABI-mode bindings or with GGML_PY_NO_CHECKED=1 set,
#: and every op then takes its Python path (tests/test_checked.py runs the same generated
#: calls both ways)
CHECKED_OPS: Any = lib if HELPERS and not os.environ.get("GGML_PY_NO_CHECKED") else None
FLOAT_MASK = type_mask(FLOAT)
_RULE_LOCK = threading.Lock()


def rule(mask: int) -> int:
    """The id helpers.c knows the type set `mask` by, for the checked ops that take one
    (registered once, at an ops module's import; -1, which refuses every type, without the
    helpers or when helpers.c's table of 64 is full)."""
    if CHECKED_OPS is None:
        return -1
    with _RULE_LOCK:                 # (cffi lets go of the GIL: one registration at a time)
        return int(CHECKED_OPS.ggml_py_rule(mask))


def tensor(x: Tensor, op: str, what: str = "a") -> Tensor:
    """`x` as an open Tensor operand of `op`, else InvalidType/ClosedError."""
    if not isinstance(x, TensorBase):
        raise InvalidType(f"{op}: {what} must be a Tensor, not {type(x).__name__}")
    x.ptr  # closed context -> ClosedError
    return x


def floats(op: str, *ts: TensorBase) -> None:
    for t in ts:
        if t.type.name not in FLOAT:
            raise InvalidType(f"{op}: needs float tensors (f32/f16/bf16), got {t.type.name}")


def cpu_type(t: TensorBase, op: str, rule: str | None = None) -> None:
    allowed = CPU_TYPES[rule or op]
    if t.type.name not in allowed and not ("quantized" in allowed and t.type.block_size > 1):
        since = CPU_TYPES_SINCE.get((rule or op, t.type.name))
        later = (f" (pinned releases compute {t.type.name} here from "
                 f"{'.'.join(map(str, since))} on; this build is "
                 f"{'.'.join(map(str, RELEASE))})") if since else ""
        raise InvalidType(f"{op}: ggml's kernels compute {'/'.join(sorted(allowed))}, "
                          f"not {t.type.name}{later}; convert with "
                          "gg.cpy(t, ctx.tensor(gg.f32, t.shape))")


def rows(op: str, *named: tuple[str, TensorBase]) -> None:
    """The layout rule of almost every kernel: each row is packed (``nb[0]`` equals the
    element size). Transposed or permuted views break it; ggml's kernels then assert or read
    the wrong elements. (Quantized tensors cannot be transposed here at all.)"""
    for what, t in named:
        tt = t.type
        if tt.block_size == 1 and t.nb[0] != tt.type_size:
            raise InvalidArgument(f"{op}: the rows of {what} {t.shape} are strided (a transposed "
                                  f"or permuted view); make them contiguous with gg.cont({what})")


def blas_rows_ok(t: TensorBase) -> bool:
    """What BLAS needs of a matrix operand: a row stride (``nb[1]``, the leading dimension) of
    at least one row. ggml_is_contiguous ignores axes of length 1, so a permuted view with
    one row may keep a shorter stride there; CPU kernels never read it, but CUDA hands it to
    cuBLAS as lda/ldb, which rejects it and ggml aborts (0.26.0, ggml_cuda_mul_mat_cublas,
    out_prod)."""
    tt = t.type
    return tt.block_size > 1 or t.nb[1] >= t.ne[0] * tt.type_size


def blas_rows(op: str, *named: tuple[str, TensorBase]) -> None:
    for what, t in named:
        if not blas_rows_ok(t):
            raise InvalidArgument(f"{op}: {what} {t.shape} has a row stride of {t.nb[1]} bytes, "
                                  f"shorter than its rows (a view with a length-1 axis or "
                                  f"overlapping rows); cuBLAS refuses it: use gg.cont({what})")


def scalable(t: TensorBase) -> bool:
    """What ggml_scale needs: ggml.c asserts ggml_is_padded_1d (static there: packed rows, planes
    and batches one after another), the CPU kernel ggml_is_contiguous (which ignores axes of
    length 1, so both are needed)."""
    ne, nb = t.ne, t.nb
    return (nb[0] == t.type.type_size and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]
            and t.is_contiguous)


def contiguous(op: str, *named: tuple[str, TensorBase]) -> None:
    for what, t in named:
        if not t.is_contiguous:
            raise InvalidArgument(f"{op}: {what} {t.shape} must be contiguous (it is a view); "
                                  f"use gg.cont({what})")


def can_repeat(small: TensorBase, big: TensorBase) -> bool:
    s, b = small.ne, big.ne
    return b[0] % s[0] == 0 and b[1] % s[1] == 0 and b[2] % s[2] == 0 and b[3] % s[3] == 0


def prod(s: Iterable[int]) -> int:
    r = 1
    for x in s:
        r *= x
    return r


#: the first pinned release whose headers declare each function `need` asks for
#: (tests/test_ops.py checks this against the pinned trees)
ADDED = {"ggml_fill": "0.10.1", "ggml_cumsum": "0.10.1"}


def need(fn_name: str, op: str) -> Callable[..., Any]:
    """A ggml function that only some releases have, or UnsupportedError saying which
    release added it."""
    from .._loader import BUILD, lib
    fn = getattr(lib, fn_name, None)
    require(fn is not None, f"{op} is not in this ggml release ({BUILD['release']}): "
            f"{fn_name} arrived in ggml {ADDED.get(fn_name, 'a later release')}",
            UnsupportedError)
    assert fn is not None
    return fn  # type: ignore[no-any-return]


def build(owner: Tensor, fn: Callable[..., Any], *args: Any, ndim: int | None = None,
          uses: Iterable[TensorBase] = (), room: int = 4, view: bool = False,
          like: TensorBase | None = None) -> Tensor:
    """The result of ``fn(ctx_raw, *args)`` built in `owner`'s context and kept by it (`view`:
    the op may return a view of allocated memory; `like`: the result has that operand's shape
    and type)."""
    ctx = owner.ctx
    result: Tensor = ctx.build(fn, args, owner.ndim if ndim is None else ndim, uses, room,
                               view=view, like=like)
    return result


__all__ = ["FLOAT", "FLOAT_TYPES", "CPU_TYPES", "CPU_TYPES_SINCE", "RELEASE", "MAX_DIMS", "tensor", "floats",
           "cpu_type", "rows", "blas_rows", "blas_rows_ok", "contiguous",

           "can_repeat", "prod", "need", "build", "float_of", "index_of", "type_mask",
           "cpu_mask", "CHECKED_OPS", "FLOAT_MASK", "rule", "Tensor", "UnaryOp", "BinaryOp"]
