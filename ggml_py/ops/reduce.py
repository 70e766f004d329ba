"""Reductions and sorts over rows (the last numpy axis): sum, sum_rows, mean, argmax, cumsum,
argsort, top_k. Their CPU kernels read each row as packed floats without asserting it
(ggml-cpu/ops.cpp, 0.25.3), so a transposed view would give wrong numbers: refused here."""
from __future__ import annotations


from .. import _features
from .._loader import lib
from ..errors import InvalidType, require
from ._common import Tensor, build, contiguous, cpu_type, index_of, need, rows, tensor



def sum(a: Tensor) -> Tensor:
    """Sum of all elements (a 1-element tensor)."""
    a = tensor(a, "sum")
    cpu_type(a, "sum")
    rows("sum", ("a", a))
    contiguous("sum", ("a", a))      # CUDA asserts ggml_is_contiguously_allocated
    return build(a, lib.ggml_sum, a.ptr, ndim=1)


def sum_rows(a: Tensor) -> Tensor:
    """Sum of each row (ggml_sum_rows): the last numpy axis becomes 1."""
    a = tensor(a, "sum_rows")
    cpu_type(a, "sum_rows")
    rows("sum_rows", ("a", a))
    return build(a, lib.ggml_sum_rows, a.ptr)


def mean(a: Tensor) -> Tensor:
    """Mean of each row (ggml_mean)."""
    a = tensor(a, "mean")
    cpu_type(a, "mean")
    rows("mean", ("a", a))
    return build(a, lib.ggml_mean, a.ptr)


def argmax(a: Tensor) -> Tensor:
    """Index of the largest value of each row of a matrix (i32)."""
    a = tensor(a, "argmax")
    require(a.type.name == "f32", f"argmax: takes f32, got {a.type.name}", InvalidType)
    require(a.ne[2] == 1 and a.ne[3] == 1, f"argmax: takes a matrix, got {a.shape}")
    rows("argmax", ("a", a))
    contiguous("argmax", ("a", a))   # CUDA asserts contiguity
    return build(a, lib.ggml_argmax, a.ptr, ndim=1)


def cumsum(a: Tensor) -> Tensor:
    """Running sum along each row (the last numpy axis), f32."""
    a = tensor(a, "cumsum")
    require(a.type.name == "f32", f"cumsum: takes f32, got {a.type.name}", InvalidType)
    rows("cumsum", ("a", a))
    return build(a, need("ggml_cumsum", "cumsum"), a.ptr)


def argsort(a: Tensor, descending: bool = False) -> Tensor:
    """Indices (i32) that sort each row of f32 `a`."""
    a = tensor(a, "argsort")
    require(a.type.name == "f32", f"argsort: takes f32, got {a.type.name}", InvalidType)
    require(isinstance(descending, bool), "argsort: descending must be a bool", InvalidType)
    rows("argsort", ("a", a))
    contiguous("argsort", ("a", a))  # CUDA asserts contiguity
    order = lib.GGML_SORT_ORDER_DESC if descending else lib.GGML_SORT_ORDER_ASC
    return build(a, lib.ggml_argsort, a.ptr, order)


def top_k(a: Tensor, k: int) -> Tensor:
    """Indices (i32) of the `k` largest values of each row, in no particular order."""
    a = tensor(a, "top_k")
    require(a.type.name == "f32", f"top_k: takes f32, got {a.type.name}", InvalidType)
    k = index_of(k, "top_k: k")
    require(1 <= k <= a.ne[0], f"top_k: k={k} must be in 1..{a.ne[0]}")
    contiguous("top_k", ("a", a))
    out = build(a, need("ggml_top_k", "top_k"), a.ptr, k, view=bool(_TOP_K_IS_A_VIEW))
    if _TOP_K_IS_A_VIEW:               # ggml 0.9.x: a view of the first k of argsort
        from .shape import cont
        out = cont(out)
    return out


# without its own op, ggml_top_k returns a strided view of a full argsort; ggml_py makes it
# contiguous, as the GGML_OP_TOP_K result is
_TOP_K_IS_A_VIEW = not _features.TOP_K_OP


__all__ = ["sum", "sum_rows", "mean", "argmax", "cumsum", "argsort", "top_k"]
