"""Row indexing: get_rows (embedding lookup) and set_rows (scatter rows). Index values are
range-checked when a graph computes (ggml asserts on a bad index; an RPC server dies of it)."""
from __future__ import annotations

from typing import Any

from .._loader import ffi, lib
from ..errors import InvalidArgument, InvalidType, require
from ._common import Tensor, FLOAT, build, cpu_type, rows, tensor



def _op(name: str) -> int:
    v = getattr(lib, f"GGML_OP_{name}", None)
    return -1 if v is None else int(v)


# The rule for index operands (every op that reads row numbers from a tensor): each value
# must be provably a row of the table before ggml runs, since ggml asserts on a bad one. Its
# values come either from leaves, whose values are range-checked at each compute, or from an
# op whose results are in a known range (argsort/top_k/argmax of rows of n: 0..n-1), through ops that
# only move values (views, copies, get_rows of an index table). Anything else is refused when
# the op is built. index_origin() walks that provenance; ops and Graph both use it.
_MOVES = {_op(n) for n in ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT", "CPY", "DUP")} - {-1}
_RANKS = {_op(n) for n in ("ARGSORT", "TOP_K", "ARGMAX")} - {-1}
_NONE, _GET_ROWS = int(lib.GGML_OP_NONE), int(lib.GGML_OP_GET_ROWS)
_INT = {int(lib.GGML_TYPE_I32), int(lib.GGML_TYPE_I64)}


def index_origin(p: Any) -> "tuple[list[Any], int | None] | None":
    """Where the values of the raw index tensor `p` come from: (leaves whose values bound
    them, checked at compute; the bound of ranked values, exclusive, or None when there are
    none), or None when no range is known (a computed value)."""
    leaves: list[Any] = []
    bound: int | None = None
    todo, seen = [p], set()
    while todo:
        q = todo.pop()
        a = int(ffi.cast("uintptr_t", q))
        if a in seen:
            continue
        seen.add(a)
        op = int(q.op)
        if op == _NONE:
            if int(q.type) not in _INT:
                return None
            leaves.append(q)
        elif op in _RANKS:
            bound = max(bound or 0, int(q.src[0].ne[0]))
        elif op in _MOVES and int(q.type) in _INT:
            todo.append(q.src[0])
        elif op == _GET_ROWS and int(q.type) in _INT:
            todo.append(q.src[0])          # the values of the index table it picks from
        else:
            return None
    return leaves, bound


def _index_operand(idx: "Tensor", n_rows: int, what: str) -> None:
    """InvalidArgument unless `idx`'s values are provably rows 0..n_rows-1 (see above)."""
    origin = index_origin(idx.ptr)
    if origin is None:
        raise InvalidArgument(
            f"{what}: the indices are computed by op {idx.op}, whose values have no known "
            "range; ggml would abort on one out of range. Compute them in another graph and "
            "feed them as an input (range-checked at each compute)")
    bound = origin[1]
    if bound is not None and bound > n_rows:
        raise InvalidArgument(f"{what}: the indices are ranks in 0..{bound - 1} (argsort/top_k/argmax "
                              f"of rows of {bound}), past the {n_rows} rows they index")


def get_rows(a: Tensor, idx: Tensor) -> Tensor:
    """Rows of `a` picked by the i32 indices `idx` (embedding lookup): a (..., R, n) with
    ggml ne [n, R, B, C]; idx ne [r, B, C]."""
    a, idx = tensor(a, "get_rows", "a"), tensor(idx, "get_rows", "indices")
    require(idx.type.name == "i32", f"get_rows: indices must be i32, got {idx.type.name}",
            InvalidType)
    require(a.type.name in FLOAT + ("i32",) or a.type.block_size > 1,
            f"get_rows: ggml's CPU backend reads rows of float, i32 or quantized tensors, not "
            f"{a.type.name}", InvalidType)
    require(a.ne[2] == idx.ne[1] and a.ne[3] == idx.ne[2] and idx.ne[3] == 1,
            f"get_rows: index shape {idx.shape} does not fit {a.shape} (ggml: a.ne2 == idx.ne1, "
            "a.ne3 == idx.ne2, idx.ne3 == 1)")
    rows("get_rows", ("a", a), ("indices", idx))
    _index_operand(idx, a.ne[1], "get_rows")
    return build(a, lib.ggml_get_rows, a.ptr, idx.ptr, ndim=max(a.ndim, idx.ndim + 1), uses=(idx,))


def set_rows(dst: Tensor, src: Tensor, idx: Tensor) -> Tensor:
    """``dst[idx] = src`` row-wise (ggml_set_rows): returns `dst` as updated by the graph.
    dst (..., R, n), src (..., r, n) f32/f16, idx (r,) i32 or i64 with 0 <= idx < R."""
    dst, src = tensor(dst, "set_rows", "dst"), tensor(src, "set_rows", "src")
    idx = tensor(idx, "set_rows", "indices")
    cpu_type(src, "set_rows", "set_rows src")
    require(dst.type.name in FLOAT or dst.type.block_size > 1,
            f"set_rows: rows convert into float or quantized tensors, not {dst.type.name}",
            InvalidType)
    require(idx.type.name in ("i32", "i64"), f"set_rows: indices must be i32 or i64, got "
                                             f"{idx.type.name}", InvalidType)
    require(dst.ne[0] == src.ne[0] and dst.ne[2:] == src.ne[2:],
            f"set_rows: rows of {src.shape} do not fit {dst.shape}")
    require(src.ne[1] == idx.ne[0] and src.ne[2] % idx.ne[1] == 0 and src.ne[3] % idx.ne[2] == 0
            and idx.ne[3] == 1, f"set_rows: {idx.shape} indices for {src.ne[1]} rows")
    for t, what in ((dst, "dst"), (src, "src")):
        require(bool(lib.ggml_is_contiguous_rows(t.ptr)), f"set_rows: {what} rows must be contiguous")
    rows("set_rows", ("indices", idx))
    _index_operand(idx, dst.ne[1], "set_rows")
    return build(dst, lib.ggml_set_rows, dst.ptr, src.ptr, idx.ptr, uses=(src, idx), view=True)


__all__ = ["get_rows", "set_rows"]
