"""gg.gguf.write: metadata and layout through ggml's gguf API, tensor bytes streamed after it.

Rules, each in one place:

- plan first (:func:`_plan`): every key, value and type is checked and converted in Python
  before the first C call, so everything ggml would abort on (a duplicate tensor name,
  general.alignment of another type, not a power of 2 or over u32, a name too long, a row not
  a whole number of blocks) raises and nothing is written;
- numbers leave in GGUF's byte order (:func:`_le`, little-endian whatever the array's);
- narrowing is checked (:func:`_numbers`): an int out of its type's range and a finite float
  that the type would turn into inf are refused; inferred types widen instead (i32 -> i64 ->
  u64, f32 -> f64), as gguf-py's do for ints;
- a Tensor's bytes are read through the tensor layer (``_transfer.blocking_get``: a closed
  context, a dead RPC server, a buffer the layer refuses raise there);
- each call writes its own temporary file (:func:`_temporary`) and renames it over `path`:
  two writers of one path leave one of the two files, whole.
"""
from __future__ import annotations

import itertools
import os
import struct
import tempfile
import threading
from typing import TYPE_CHECKING, Any, BinaryIO, Callable

import numpy as np

from . import _gguf_check as chk
from . import _features, _transfer
from ._loader import ffi, lib
from .errors import GGMLError, InvalidArgument, InvalidType, check_ptr

if TYPE_CHECKING:
    from ._types import GGMLType

Emit = Callable[[BinaryIO], object]

CHUNK = 64 << 20
_INT: dict[str, type[np.integer[Any]]] = {
    "u8": np.uint8, "i8": np.int8, "u16": np.uint16, "i16": np.int16, "u32": np.uint32,
        "i32": np.int32, "u64": np.uint64, "i64": np.int64}
_FLOAT: dict[str, type[np.floating[Any]]] = {"f32": np.float32, "f64": np.float64}
_NP_NAME: dict[np.dtype[Any], str] = {
    np.dtype(v): k for k, v in {**_INT, **_FLOAT, "bool": np.bool_}.items()}
_TENSOR_DTYPES = {"float32": "f32", "float16": "f16", "float64": "f64", "int8": "i8",
                  "int16": "i16", "int32": "i32", "int64": "i64"}


def _le(a: Any, dtype: Any) -> np.ndarray[Any, Any]:
    """`a` as a contiguous array of `dtype` in GGUF's byte order (little-endian): the one
    conversion every number written goes through."""
    return np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<"))


_F32_MAX = float(np.finfo(np.float32).max)


def _float_kind(values: list[Any]) -> str:
    """f32, or f64 when a finite value would overflow f32 (as ints widen past i32)."""
    a = np.asarray(values, dtype=np.float64)
    return "f64" if bool((np.isfinite(a) & (np.abs(a) > _F32_MAX)).any()) else "f32"


def _parse_type(key: str, spec: str) -> tuple[str, bool]:
    if not isinstance(spec, str):
        raise InvalidType(f"types[{key!r}] must be a string such as 'u32' or 'arr[str]'")
    is_arr = spec.startswith("arr[") and spec.endswith("]")
    et = spec[4:-1] if is_arr else spec
    if et not in chk.TYPE_IDS or et == "arr":
        raise InvalidType(f"types[{key!r}]: unknown GGUF type {spec!r}")
    return et, is_arr


def _int_kind(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    if -2**31 <= lo and hi < 2**31:
        return "i32"
    if -2**63 <= lo and hi < 2**63:
        return "i64"
    if 0 <= lo and hi < 2**64:
        return "u64"
    raise InvalidArgument(f"integer {hi if hi >= 2**63 else lo} does not fit in 64 bits")


def _infer(key: str, v: Any) -> tuple[str, bool]:
    if key == "general.alignment":
        return "u32", False
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if isinstance(v, (bool, np.bool_)):
        return "bool", False
    if isinstance(v, np.generic) and v.dtype.newbyteorder("=") in _NP_NAME:
        return _NP_NAME[v.dtype.newbyteorder("=")], False
    if isinstance(v, int):
        return _int_kind([v]), False
    if isinstance(v, float):
        return _float_kind([v]), False
    if isinstance(v, (str, bytes)):
        return "str", False
    if isinstance(v, np.ndarray):
        if v.dtype.newbyteorder("=") in _NP_NAME:
            return _NP_NAME[v.dtype.newbyteorder("=")], True
        if v.dtype.kind in "US":
            return "str", True
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        if not v or all(isinstance(x, (str, bytes)) for x in v):
            return "str", True
        if all(isinstance(x, (bool, np.bool_)) for x in v):
            return "bool", True
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in v):
            return _int_kind([int(x) for x in v]), True
        if all(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
               for x in v):
            try:
                return _float_kind([float(x) for x in v]), True
            except OverflowError:
                raise InvalidArgument(f"metadata {key!r}: a value is beyond f64's range") from None
        if any(isinstance(x, (list, tuple, np.ndarray)) for x in v):
            raise InvalidType(f"metadata {key!r}: ggml's gguf API has no arrays of arrays")
        raise InvalidType(f"metadata {key!r}: an array mixes types ({type(v[0]).__name__}, ...)")
    raise InvalidType(f"metadata {key!r}: cannot store a {type(v).__name__} in GGUF")


def _cstring(key: str, s: Any) -> bytes:
    b = s if isinstance(s, bytes) else str(s).encode("utf-8", "surrogateescape") \
        if isinstance(s, str) else None
    if b is None:
        raise InvalidType(f"metadata {key!r}: expected a string, got {type(s).__name__}")
    if b"\0" in b:
        raise InvalidArgument(f"metadata {key!r}: a NUL byte in a string (ggml's gguf API "
                              "takes C strings)")
    return b


def _numbers(key: str, et: str, v: Any, is_arr: bool) -> np.ndarray[Any, Any]:
    """The values as a 1-D little-endian array of `et` (bool as bytes), kind-checked, and
    refused where the conversion would change a value (the narrowing rule)."""
    seq = v if is_arr else [v]
    if isinstance(seq, np.ndarray):
        if seq.ndim != 1:
            raise InvalidArgument(f"metadata {key!r}: arrays are 1-D, got shape {seq.shape}")
        a: np.ndarray[Any, Any] | None = seq if seq.dtype != object else None
        items: list[Any] = seq.tolist() if a is None else []
    elif isinstance(seq, (list, tuple)):
        a, items = None, list(seq)
    else:
        raise InvalidType(f"metadata {key!r}: a list of {et} expected, got {type(v).__name__}")
    if a is None:   # Python values: check each one's kind, then let numpy hold them
        ints = all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
                   for x in items)
        if et == "bool":
            if not all(isinstance(x, (bool, np.bool_)) for x in items):
                raise InvalidType(f"metadata {key!r}: bool values must be True/False")
            return np.array(items, dtype=np.bool_).view(np.uint8)
        if et in _INT and not ints:
            raise InvalidType(f"metadata {key!r}: {et} takes integers")
        if et in _FLOAT and not all(isinstance(x, (int, float, np.integer, np.floating))
                                    and not isinstance(x, (bool, np.bool_)) for x in items):
            raise InvalidType(f"metadata {key!r}: {et} takes numbers")
        if ints and et in _INT:
            a = np.array([int(x) for x in items], dtype=object)
        else:
            try:
                a = np.array([float(x) for x in items], dtype=np.float64)
            except OverflowError:
                raise InvalidArgument(f"metadata {key!r}: a value is beyond f64's range") from None
    kind = a.dtype.kind
    if et == "bool":
        if kind != "b":
            raise InvalidType(f"metadata {key!r}: bool values must be True/False")
        return _le(a, np.bool_).view(np.uint8)
    if et in _INT:
        if kind not in "iuO":
            raise InvalidType(f"metadata {key!r}: {et} takes integers, not {a.dtype}")
        info = np.iinfo(_INT[et])
        if a.size and (int(a.min()) < info.min or int(a.max()) > info.max):
            raise InvalidArgument(f"metadata {key!r}: a value is out of {et}'s range "
                                  f"[{info.min}, {info.max}]")
        return _le(a.astype(_INT[et]) if kind == "O" else a, _INT[et])
    if kind not in "iuf":
        raise InvalidType(f"metadata {key!r}: {et} takes numbers, not {a.dtype}")
    with np.errstate(over="ignore"):
        out = _le(a, _FLOAT[et])
    grew = ~np.isfinite(out) & np.isfinite(a)
    if grew.any():
        bad = a[grew][0]
        raise InvalidArgument(f"metadata {key!r}: {bad!r} is beyond {et}'s range "
                              f"(give types={{{key!r}: '{'arr[f64]' if is_arr else 'f64'}'}})")
    return out


#: one metadata entry, checked and converted: (key bytes, element type, is array, payload);
#: the payload is a C string (str), a list of C strings (arr[str]) or a little-endian array
Entry = tuple[bytes, str, bool, Any]


def _plan(metadata: dict[str, Any], types: dict[str, str]) -> tuple[list[Entry], int | None]:
    """Every key, value and type checked and converted before any C call; the alignment
    (None when not given)."""
    if not isinstance(metadata, dict):
        raise InvalidType("metadata must be a dict of key -> value")
    if not isinstance(types, dict):
        raise InvalidType("types must be a dict of key -> GGUF type name")
    plan: list[Entry] = []
    alignment = None
    for key, v in metadata.items():
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"metadata keys are non-empty strings, not {key!r}")
        kb = _cstring("(key)", key)
        spec = types.get(key)
        et, is_arr = _parse_type(key, spec) if spec is not None else _infer(key, v)
        if key == "general.alignment":
            if (et, is_arr) != ("u32", False) or isinstance(v, (bool, np.bool_)) \
                    or not isinstance(v, (int, np.integer)) \
                    or not 0 < int(v) < 2**32 or int(v) & (int(v) - 1):
                raise InvalidArgument(f"general.alignment must be a u32 power of 2, not {v!r}")
            alignment = int(v)
        if et == "str":
            if not is_arr:
                plan.append((kb, et, False, _cstring(key, v)))
                continue
            if isinstance(v, np.ndarray):
                v = v.tolist()
            if not isinstance(v, (list, tuple)):
                raise InvalidType(f"metadata {key!r}: a list of strings expected")
            plan.append((kb, et, True, [_cstring(key, s) for s in v]))
            continue
        plan.append((kb, et, is_arr, _numbers(key, et, v, is_arr)))
    return plan, alignment


def _apply(gctx: Any, entry: Entry) -> None:
    """One checked entry into ggml's gguf context."""
    kb, et, is_arr, payload = entry
    if et == "str":
        if not is_arr:
            lib.gguf_set_val_str(gctx, kb, payload)
            return
        keep = [ffi.new("char[]", s) for s in payload]
        lib.gguf_set_arr_str(gctx, kb, ffi.new("const char *[]", keep), len(keep))
        return
    tid = chk.TYPE_IDS[et]
    if is_arr:
        data = ffi.from_buffer("void *", payload) if payload.size else ffi.NULL
        lib.gguf_set_arr_data(gctx, kb, tid, data, payload.size)
    else:
        x = payload[0].item()
        getattr(lib, f"gguf_set_val_{et}")(gctx, kb, bool(x) if et == "bool" else x)


def _tensor_source(name: str, v: Any) -> tuple["GGMLType", tuple[int, ...], int, Emit]:
    """(GGMLType, ggml-order ne, nbytes, writer(fh)) for one tensor value."""
    import ggml_py as gg
    if isinstance(v, gg.Tensor):
        t, nbytes = v, v.nbytes
        t.require_memory("gguf.write")     # a closed context, a dead server: raise before writing
        if not t.is_contiguous:
            raise InvalidArgument(f"tensor {name!r}: needs allocated, contiguous memory")

        def emit(fh: BinaryIO) -> None:
            tmp = np.empty(min(CHUNK, nbytes), np.uint8)
            for o in range(0, nbytes, CHUNK):
                n = min(CHUNK, nbytes - o)
                # the tensor layer's read: its checks (liveness, buffer kinds) run per chunk
                _transfer.blocking_get(t, tmp[:n], o)
                fh.write(tmp[:n].data)
        return t.type, tuple(t.ne[:max(t.ndim, 1)]), nbytes, emit
    if isinstance(v, tuple) and len(v) == 3:
        tp, shape, data = v
        gt = gg.TYPES.get(tp) if isinstance(tp, str) else \
            next((t for t in gg.TYPES.values()
                  if isinstance(tp, (int, np.integer)) and int(t) == tp), None)
        if gt is None:
            raise InvalidType(f"tensor {name!r}: unknown ggml type {tp!r}")
        raw = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) \
            else np.ascontiguousarray(data)
        if raw.dtype != np.uint8:
            raise InvalidType(f"tensor {name!r}: raw data must be uint8 bytes, not {raw.dtype}")
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    elif isinstance(v, np.ndarray):
        if v.dtype.name not in _TENSOR_DTYPES:
            raise InvalidType(f"tensor {name!r}: no ggml type for dtype {v.dtype} (give "
                              "(type, shape, bytes) for other types)")
        gt, shape = gg.TYPES[_TENSOR_DTYPES[v.dtype.name]], v.shape
        raw = _le(v, v.dtype).reshape(-1).view(np.uint8)
    else:
        raise InvalidType(f"tensor {name!r}: expected a numpy array, a ggml_py Tensor or "
                          f"(type, shape, bytes), not {type(v).__name__}")
    if not 1 <= len(shape) <= int(lib.GGML_MAX_DIMS) or any(s < 0 for s in shape):
        raise InvalidArgument(f"tensor {name!r}: shape {shape} (1 to {int(lib.GGML_MAX_DIMS)} "
                              "axes, none negative)")
    ne = tuple(reversed(shape))
    if ne[0] % gt.block_size:
        raise InvalidArgument(f"tensor {name!r}: rows of {ne[0]} are not whole {gt.name} blocks "
                              f"of {gt.block_size}")
    rows = int(np.prod(ne[1:], dtype=object)) if len(ne) > 1 else 1
    nbytes = ne[0] // gt.block_size * gt.type_size * rows
    if raw.nbytes != nbytes:
        raise InvalidArgument(f"tensor {name!r}: {raw.nbytes} bytes of data for a {gt.name} "
                              f"tensor of shape {tuple(shape)}, which takes {nbytes}")
    return gt, ne, nbytes, lambda fh: fh.write(raw.data)


def _init(alignment: int | None) -> Any:
    if alignment is None:
        return lib.gguf_init_empty()
    # gguf_set_val_u32("general.alignment") does not change the alignment the writer pads to
    # (docs/upstream-gguf.md); a context read from a header that carries it does
    key = b"general.alignment"
    head = (chk.MAGIC + struct.pack("<Iqq", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<iI", chk.T_U32, int(alignment)))
    params = ffi.new("struct gguf_init_params *", {"no_alloc": True, "ctx": ffi.NULL})
    if _features.GGUF_FROM_BUFFER:
        return lib.gguf_init_from_buffer(head, len(head), params[0])
    with tempfile.TemporaryFile() as fh:      # a release that parses from a file only
        fh.write(head)
        fh.flush()
        return lib.gguf_init_from_file(f"/dev/fd/{fh.fileno()}".encode(), params[0])


_calls = itertools.count()


def _temporary(path: str) -> tuple[str, BinaryIO]:
    """A new file beside `path`, its name unique to this call (process, thread and a counter),
    created exclusively: no other writer shares it."""
    while True:
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.{next(_calls)}.part"
        try:
            return tmp, open(tmp, "xb")
        except FileExistsError:
            continue        # left behind by a process killed while writing: take the next


def write(path: str | os.PathLike[str], metadata: dict[str, Any], tensors: Any,
          types: dict[str, str]) -> None:
    path = os.fspath(path)
    plan, alignment = _plan(metadata, types)
    items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
    sources: list[tuple[bytes, GGMLType, tuple[int, ...], int, Emit]] = []
    names: set[str] = set()
    for entry in items:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise InvalidType("tensors must be a dict or a list of (name, value) pairs")
        name, v = entry
        nb = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else b""
        if not nb or b"\0" in nb or len(nb) >= int(lib.GGML_MAX_NAME):
            raise InvalidArgument(f"tensor names are 1 to {int(lib.GGML_MAX_NAME) - 1} bytes "
                                  f"without NUL, not {name!r}")
        if name in names:
            raise InvalidArgument(f"duplicate tensor name {name!r}")
        names.add(name)
        sources.append((nb, *_tensor_source(name, v)))
    gctx = check_ptr(_init(alignment),
                     "gguf_init failed")
    mctx = ffi.NULL
    try:
        for e in plan:
            _apply(gctx, e)
        align = int(lib.gguf_get_alignment(gctx))
        overhead = int(lib.ggml_tensor_overhead())
        mctx = lib.ggml_init({"mem_size": overhead * (len(sources) + 1), "mem_buffer": ffi.NULL,
                              "no_alloc": True})
        for nb, gt, ne, _, _ in sources:
            t = lib.ggml_new_tensor(mctx, int(gt), len(ne), ffi.new("int64_t[]", list(ne)))
            lib.ggml_set_name(t, nb)
            lib.gguf_add_tensor(gctx, t)
        n = int(lib.gguf_get_meta_size(gctx))
        meta = ffi.new("char[]", n)
        lib.gguf_get_meta_data(gctx, meta)
        offsets = [int(lib.gguf_get_tensor_offset(gctx, i)) for i in range(len(sources))]
    finally:
        if mctx != ffi.NULL:
            lib.ggml_free(mctx)
        lib.gguf_free(gctx)
    tmp, fh = _temporary(path)
    try:
        with fh:
            fh.write(ffi.buffer(meta, n))
            for (_, _, _, nbytes, emit), off in zip(sources, offsets):
                if fh.tell() != n + off:
                    raise GGMLError(f"{path}: tensor data at {fh.tell()}, ggml placed it at {n + off}")
                emit(fh)
                fh.write(b"\0" * (-nbytes % align))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
