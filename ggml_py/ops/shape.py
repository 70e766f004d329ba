"""Shape and copy ops: views (reshape, view, permute, transpose), copies (cont, cpy) and
tiling (repeat, concat, pad). Views share memory; a view of allocated memory is usable at once.
"""
from __future__ import annotations

import builtins
from typing import Any

from .._loader import lib
from .._tensor_base import TensorBase, shape_of
from .._types import GGMLType
from ..errors import InvalidType, require
from ._common import (Tensor, CHECKED_OPS, FLOAT, MAX_DIMS, build, contiguous, cpu_mask, cpu_type,
                      index_of, need, prod, rows, rule, tensor)


#: (ndim, numpy axes) -> ggml's permutation, for each valid permutation met (axes of ints)
_PERMS: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {}
_STRIDED = rule(cpu_mask("strided copy"))      # the types cont gathers from a view
_C_RESHAPE: Any = CHECKED_OPS.ggml_py_reshape if CHECKED_OPS is not None else None
_C_PERMUTE: Any = CHECKED_OPS.ggml_py_permute if CHECKED_OPS is not None else None
_C_CONT: Any = CHECKED_OPS.ggml_py_cont if CHECKED_OPS is not None else None


def _plain_ne(shape: tuple[Any, ...]) -> tuple[int, int, int, int] | None:
    """ggml's ne for a numpy-order shape of 1 to 4 plain ints (None for anything else: the
    Python path parses it)."""
    n = len(shape)
    if n == 1:
        s0, = shape
        return (s0, 1, 1, 1) if s0.__class__ is int else None
    if n == 2:
        s0, s1 = shape
        return (s1, s0, 1, 1) if s0.__class__ is int and s1.__class__ is int else None
    if n == 3:
        s0, s1, s2 = shape
        return ((s2, s1, s0, 1) if s0.__class__ is int and s1.__class__ is int
                and s2.__class__ is int else None)
    if n == 4:
        s0, s1, s2, s3 = shape
        return ((s3, s2, s1, s0) if s0.__class__ is int and s1.__class__ is int
                and s2.__class__ is int and s3.__class__ is int else None)
    return None


def reshape(a: Tensor, shape: Any) -> Tensor:
    """A view of contiguous `a` with another numpy-order shape (same element count; one axis
    may be -1)."""
    cls = a.__class__
    if cls.__base__ is TensorBase and shape.__class__ is tuple and _C_RESHAPE is not None:
        plain = _plain_ne(shape)
        if plain is not None:           # the rule below in one C call (helpers.c)
            ctx = a.ctx
            try:
                p = _C_RESHAPE(ctx.checked_state, a._p, *plain)
            except OverflowError:       # a size past int64: the Python path says so
                p = None
            if p:
                return cls(p, ctx, len(shape))
    a = tensor(a, "reshape")
    if isinstance(shape, (str, bytes)):
        raise InvalidType(f"reshape: shape must be ints, not {shape!r}")
    if hasattr(shape, "__iter__"):
        dims = tuple(index_of(s, "reshape: shape") for s in shape)
    else:
        dims = (index_of(shape, "reshape: shape"),)
    if -1 in dims:
        known = prod(s for s in dims if s != -1)
        require(dims.count(-1) == 1 and known > 0 and a.size % known == 0,
                f"reshape: cannot reshape {a.shape} into {dims}")
        dims = tuple(a.size // known if s == -1 else s for s in dims)
    require(1 <= len(dims) <= MAX_DIMS and all(s > 0 for s in dims),
            f"reshape: bad shape {dims} (1 to {MAX_DIMS} axes, each >= 1)")
    require(prod(dims) == a.size,
            f"reshape: cannot reshape {a.shape} ({a.size} elements) into {dims}")
    contiguous("reshape", ("a", a))
    ne = list(reversed(dims)) + [1] * (4 - len(dims))
    require(ne[0] % a.type.block_size == 0, "reshape: the new last axis would split quantized blocks")
    return build(a, lib.ggml_reshape_4d, a.ptr, *ne, ndim=len(dims), view=True)


def view(a: Tensor, shape: Any, offset: int = 0, strides: Any = None) -> Tensor:
    """A view of `a`'s memory: numpy-order `shape`, byte `offset`, numpy-order byte `strides`
    (the last one must be the element size)."""
    a = tensor(a, "view")
    dims = shape_of(shape, "view: shape")
    offset = index_of(offset, "view: offset")
    ne = list(reversed(dims)) + [1] * (4 - len(dims))
    require(a.type.block_size == 1, "view: views of quantized tensors are not supported here",
            InvalidType)
    ts = a.type.type_size
    if strides is None:
        nb = [ts]
        for i in range(1, 4):
            nb.append(nb[-1] * ne[i - 1])
    else:
        if isinstance(strides, (str, bytes)):
            raise InvalidType(f"view: strides must be ints, not {strides!r}")
        st = tuple(index_of(s, "view: strides") for s in strides)
        require(len(st) == len(dims), f"view: {len(st)} strides for {len(dims)} axes")
        require(st[-1] == ts, f"view: the last stride must be the element size {ts}, got {st[-1]}")
        require(all(s > 0 for s in st), f"view: strides must be positive, got {st}")
        nb = [ts] + [s for s in reversed(st[:-1])]
        nb += [nb[-1] * ne[len(nb) - 1]] * (4 - len(nb))
    last = offset + builtins.sum((n - 1) * s for n, s in zip(ne, nb)) + ts
    require(offset >= 0 and last <= a.nbytes,
            f"view: {dims} at offset {offset} runs past the tensor's {a.nbytes} bytes")
    return build(a, lib.ggml_view_4d, a.ptr, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3],
                 offset, ndim=len(dims), view=True)


def permute(a: Tensor, axes: Any) -> Tensor:
    """numpy's ``np.transpose(a, axes)`` as a view."""
    cls = a.__class__
    if cls.__base__ is TensorBase and _C_PERMUTE is not None:
        nd = a._ndim
        if axes.__class__ is tuple:
            for x in axes:
                if x.__class__ is not int:      # (True == 1: a bool must meet index_of; an
                    break                       # unhashable axis must not reach the dict)
            else:
                known = _PERMS.get((nd, axes))
                if known is not None:   # a permutation met before, checked in C (helpers.c)
                    ctx = a.ctx
                    p = _C_PERMUTE(ctx.checked_state, a._p, *known)
                    if p:
                        return cls(p, ctx, nd)
    a = tensor(a, "permute")
    n = a.ndim
    if isinstance(axes, (str, bytes)):
        raise InvalidType(f"permute: axes must be ints, not {axes!r}")
    if not hasattr(axes, "__iter__"):
        raise InvalidType(f"permute: axes must be a sequence of ints, not {axes!r}")
    ax = tuple(index_of(x, "permute: axes") for x in axes)
    ax = tuple(x + n if x < 0 else x for x in ax)
    require(sorted(ax) == list(range(n)), f"permute: axes {tuple(axes)} are not a permutation "
                                          f"of {n} axes")
    # numpy axis i -> ggml dim n-1-i ; result numpy axis j takes input axis ax[j]
    gperm = [0, 1, 2, 3]
    for j, src_axis in enumerate(ax):
        gperm[n - 1 - src_axis] = n - 1 - j
    require(a.type.block_size == 1 or gperm[0] == 0,
            f"permute: the last axis of a {a.type.name} tensor holds its quantized blocks and "
            "cannot move", InvalidType)
    if axes.__class__ is tuple and all(x.__class__ is int for x in axes) and len(_PERMS) < 4096:
        _PERMS[(n, axes)] = tuple(gperm)      # (a valid permutation of n axes: reused as is)
    return build(a, lib.ggml_permute, a.ptr, *gperm, ndim=n, view=True)


def transpose(a: Tensor) -> Tensor:
    """Swap the last two numpy axes (ggml_transpose: ne0 <-> ne1), a view."""
    a = tensor(a, "transpose")
    require(a.type.block_size == 1, f"transpose: a {a.type.name} tensor's rows are quantized "
                                    "blocks; dequantize (gg.cpy to f32) first", InvalidType)
    return build(a, lib.ggml_transpose, a.ptr, ndim=max(a.ndim, 2), view=True)


def cont(a: Tensor) -> Tensor:
    """A contiguous copy of `a` (any layout)."""
    cls = a.__class__
    if cls.__base__ is TensorBase and _C_CONT is not None:         # the rule below in C
        ctx = a.ctx
        p = _C_CONT(ctx.checked_state, a._p, _STRIDED)
        if p:
            return cls(p, ctx, a._ndim)
    a = tensor(a, "cont")
    if not a.is_contiguous:                      # gathering a view: CUDA's copy kernels
        cpu_type(a, "cont", "strided copy")
    return build(a, lib.ggml_cont, a.ptr)


def can_convert(src: GGMLType, dst: GGMLType) -> bool:
    """The conversions ggml's CPU copy kernel has (ggml_compute_forward_dup, 0.25.3)."""
    if src == dst:
        return True
    q = dst.block_size > 1
    return {"f16": dst.name in FLOAT or q, "bf16": dst.name in FLOAT or q,
            "f32": dst.name in FLOAT + ("i32",) or q, "i32": dst.name == "f32"}.get(
        src.name, src.block_size > 1 and dst.name == "f32")


def cpy(a: Tensor, b: Tensor) -> Tensor:
    """Copy `a` into `b` (same element count; converts types ggml can convert). The result
    is `b` as written by the graph; it belongs to b's context."""
    a, b = tensor(a, "cpy", "a"), tensor(b, "cpy", "b")
    require(a.size == b.size, f"cpy: {a.size} elements into {b.size}")
    require(can_convert(a.type, b.type),
            f"cpy: ggml's CPU backend does not convert {a.type.name} to {b.type.name}", InvalidType)
    if not (a.is_contiguous and b.is_contiguous):
        cpu_type(a, "cpy", "strided copy")
        require(b.type.block_size == 1 or b.is_contiguous,
                "cpy: a quantized destination must be contiguous")
    return build(b, lib.ggml_cpy, a.ptr, b.ptr, uses=(a,), view=True)


def repeat(a: Tensor, shape: Any) -> Tensor:
    """Tile `a` to numpy-order `shape` (each axis a multiple of a's)."""
    a = tensor(a, "repeat")
    cpu_type(a, "repeat")
    dims = shape_of(shape, "repeat: shape")
    require(len(dims) >= a.ndim, f"repeat: {dims} has fewer axes than {a.shape}")
    ne = list(reversed(dims)) + [1] * (4 - len(dims))
    require(all(n % m == 0 for m, n in zip(a.ne, ne)), f"repeat: {a.shape} does not tile into {dims}")
    rows("repeat", ("a", a))
    return build(a, lib.ggml_repeat_4d, a.ptr, *ne, ndim=len(dims))


def concat(a: Tensor, b: Tensor, axis: int = 0) -> Tensor:
    """numpy's ``np.concatenate([a, b], axis)``."""
    a, b = tensor(a, "concat", "a"), tensor(b, "concat", "b")
    require(a.ndim == b.ndim, f"concat: {a.ndim}-D and {b.ndim}-D tensors ({a.shape}, {b.shape})")
    n = a.ndim
    axis = index_of(axis, "concat: axis")
    axis = axis + n if axis < 0 else axis
    require(0 <= axis < n, f"concat: axis {axis} out of range for {n} axes")
    dim = n - 1 - axis
    require(a.type == b.type, f"concat: types differ ({a.type.name}, {b.type.name})", InvalidType)
    require(a.type.block_size == 1, f"concat: {a.type.name} blocks cannot be concatenated",
            InvalidType)
    require(all(a.ne[i] == b.ne[i] for i in range(4) if i != dim),
            f"concat: shapes {a.shape} and {b.shape} differ off axis {axis}")
    rows("concat", ("a", a), ("b", b))
    return build(a, lib.ggml_concat, a.ptr, b.ptr, dim, ndim=n, uses=(b,))


def pad(a: Tensor, widths: Any) -> Tensor:
    """Zero padding, numpy's ``np.pad(a, widths)``: one (before, after) pair per axis, or one
    int per axis meaning (0, int)."""
    a = tensor(a, "pad")
    require(a.type.name == "f32", f"pad: takes f32, got {a.type.name}", InvalidType)
    if isinstance(widths, (str, bytes)):
        raise InvalidType(f"pad: widths must be ints or pairs of ints, not {widths!r}")
    if not hasattr(widths, "__iter__"):
        raise InvalidType(f"pad: widths must be ints or pairs of ints, not {widths!r}")
    pairs = [(0, index_of(w, "pad: widths")) if not hasattr(w, "__iter__")
             else tuple(index_of(x, "pad: widths") for x in w) for w in widths]
    require(len(pairs) == a.ndim, f"pad: {len(pairs)} widths for {a.ndim} axes")
    require(all(len(p) == 2 and p[0] >= 0 and p[1] >= 0 for p in pairs),
            f"pad: widths {widths} must be non-negative (before, after) pairs")
    rows("pad", ("a", a))
    g = list(reversed(pairs)) + [(0, 0)] * (4 - len(pairs))   # ggml dim order
    if any(lo for lo, _ in g):
        fn = need("ggml_pad_ext", "pad before an axis (ggml_pad_ext)")
        return build(a, fn, a.ptr, *(x for pair in g for x in pair))
    return build(a, lib.ggml_pad, a.ptr, *(hi for _, hi in g))


__all__ = ["reshape", "view", "permute", "transpose", "cont", "cpy", "repeat", "concat", "pad"]
