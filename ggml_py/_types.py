"""ggml's tensor types by their ggml names (``gg.f32``, ``gg.q4_0``...) and numpy conversion.

Every type of the loaded release is here, read from ``enum ggml_type``; block sizes, byte
sizes and (de)quantization come from ggml's own type traits.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._loader import cstr, ffi, lib
from .errors import InvalidArgument, InvalidType, require


class GGMLType(int):
    """A ggml type (an ``enum ggml_type`` value) with its traits."""

    _name: str
    _block: int
    _size: int
    _quantized: bool

    def __new__(cls, value: int, name: str) -> "GGMLType":
        self = super().__new__(cls, value)
        self._name = name
        # fixed traits of the type, read once (they are asked on every op)
        self._block = int(lib.ggml_blck_size(value))
        self._size = int(lib.ggml_type_size(value))
        self._quantized = bool(lib.ggml_is_quantized(value))
        return self

    @property
    def name(self) -> str:
        """ggml's name of the type ("f32", "q4_0"...)."""
        return self._name

    @property
    def block_size(self) -> int:
        """Elements per block (1 for plain types, 32 for q4_0...)."""
        return self._block

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return self._size

    @property
    def is_quantized(self) -> bool:
        """Whether the type stores quantized blocks (ggml's ``ggml_is_quantized``)."""
        return self._quantized

    @property
    def numpy_dtype(self) -> "np.dtype[Any] | None":
        """The numpy dtype whose bytes equal this type's, or None (quantized, bf16)."""
        return _NUMPY.get(self._name)

    def row_size(self, n: int) -> int:
        """Bytes of a row of `n` elements of this type (``ggml_row_size``)."""
        return int(lib.ggml_row_size(self, n))

    def __repr__(self) -> str:
        return f"gg.{self._name}"

    def __reduce__(self) -> Any:
        return (by_name, (self._name,))


_NUMPY: "dict[str, np.dtype[Any]]" = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "f64": np.dtype(np.float64),
          "i8": np.dtype(np.int8), "i16": np.dtype(np.int16), "i32": np.dtype(np.int32),
          "i64": np.dtype(np.int64)}

TYPES: dict[str, GGMLType] = {}
for _cname, _value in ffi.typeof("enum ggml_type").relements.items():
    if _cname == "GGML_TYPE_COUNT":
        continue
    if not cstr(lib.ggml_type_name(_value)) or lib.ggml_blck_size(_value) == 0:
        continue  # removed types keep their number but have no traits
    _n = _cname[len("GGML_TYPE_"):].lower()
    TYPES[_n] = GGMLType(_value, _n)

_BY_VALUE = {int(t): t for t in TYPES.values()}
_FROM_NUMPY: "dict[np.dtype[Any], GGMLType]" = {v: TYPES[k] for k, v in _NUMPY.items() if k in TYPES}


def by_name(name: str) -> GGMLType:
    try:
        return TYPES[name]
    except KeyError:
        raise InvalidType(f"unknown ggml type {name!r}; this release has {sorted(TYPES)}") from None


def of(value: Any) -> GGMLType:
    """A GGMLType from a GGMLType, its name, its number, or a numpy dtype."""
    if isinstance(value, GGMLType):
        return value
    if isinstance(value, str) and value in TYPES:
        return TYPES[value]
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) in _BY_VALUE:
        return _BY_VALUE[int(value)]
    try:
        dt = np.dtype(value)
    except TypeError:
        dt = None
    if dt is not None and dt in _FROM_NUMPY:
        return _FROM_NUMPY[dt]
    raise InvalidType(f"not a ggml type: {value!r}")


def from_float_bytes(t: GGMLType, raw: np.ndarray, n: int) -> np.ndarray:
    """Dequantize `n` values of type `t` held in the bytes `raw`, with ggml's own to_float."""
    traits = lib.ggml_get_type_traits(t)
    require(traits.to_float != ffi.NULL, f"ggml has no conversion to float for {t.name}", InvalidType)
    out = np.empty(n, dtype=np.float32)
    traits.to_float(ffi.from_buffer("void *", raw), ffi.from_buffer("float *", out), n)
    return out


def quantize(array: Any, type: Any) -> tuple[np.ndarray, GGMLType]:
    """Quantize a float array (rows along the last axis) to `type` with ggml_quantize_chunk.

    Returns the raw bytes (uint8) and the type; ``Tensor.set_raw`` stores them."""
    t = of(type)
    a = np.ascontiguousarray(array, dtype=np.float32)
    require(a.ndim >= 1 and a.size > 0, "quantize needs a non-empty array")
    n_per_row = a.shape[-1]
    require(n_per_row % t.block_size == 0,
            f"rows of {n_per_row} values do not split into {t.name} blocks of {t.block_size}")
    nrows = a.size // n_per_row
    if not t.is_quantized:
        require(lib.ggml_get_type_traits(t).from_float_ref != ffi.NULL or t.numpy_dtype is not None,
                f"cannot convert to {t.name}", InvalidType)
    if t.numpy_dtype is not None:
        return a.astype(t.numpy_dtype).view(np.uint8).reshape(-1), t
    require(not lib.ggml_quantize_requires_imatrix(t),
            f"{t.name} needs an importance matrix, which quantize() does not take", InvalidArgument)
    out = np.empty(t.row_size(n_per_row) * nrows, dtype=np.uint8)
    lib.ggml_quantize_init(t)
    lib.ggml_quantize_chunk(t, ffi.from_buffer("float *", a), ffi.from_buffer("void *", out),
                            0, nrows, n_per_row, ffi.NULL)
    return out, t
