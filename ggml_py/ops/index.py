"""Row indexing: get_rows (embedding lookup) and set_rows (scatter rows). Index values are
range-checked when a graph computes (ggml asserts on a bad index; an RPC server dies of it)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .._loader import lib
from ..errors import InvalidType, require
from ._common import FLOAT, build, cpu_type, rows, tensor

if TYPE_CHECKING:
    from .._tensor import Tensor


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
    return build(dst, lib.ggml_set_rows, dst.ptr, src.ptr, idx.ptr, uses=(src, idx), view=True)


__all__ = ["get_rows", "set_rows"]
