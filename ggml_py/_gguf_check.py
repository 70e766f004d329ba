"""A structural check of a GGUF file's bytes, in Python, before ggml's parser sees them.

ggml's ``gguf_init_from_*`` refuses most malformed files, but releases differ (older ones check
less, see docs/upstream-gguf.md), and a refusal there is a line on stderr and a NULL. This walk
follows the same rules as ggml 0.25.3's reader (little-endian GGUF v2/v3, ggml's limits on
strings, arrays, names and dimensions, tensors packed in order at aligned offsets) and says
precisely what is wrong and where. It never allocates more than the file holds: every count
and length is checked against the bytes that remain before anything is read.

It only walks; values are read through ggml's API (:mod:`ggml_py.gguf`).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

MAGIC = b"GGUF"
MAX_STRING = 1 << 30          # GGUF_MAX_STRING_LENGTH in gguf.cpp
MAX_ARRAY = 1 << 30           # GGUF_MAX_ARRAY_ELEMENTS
INT64_MAX = (1 << 63) - 1
SIZE_MAX = (1 << 64) - 1

# enum gguf_type: id -> (name, byte size; 0 for str and arr)
VALUE_TYPES = {0: ("u8", 1), 1: ("i8", 1), 2: ("u16", 2), 3: ("i16", 2), 4: ("u32", 4),
               5: ("i32", 4), 6: ("f32", 4), 7: ("bool", 1), 8: ("str", 0), 9: ("arr", 0),
               10: ("u64", 8), 11: ("i64", 8), 12: ("f64", 8)}
TYPE_IDS = {name: i for i, (name, _) in VALUE_TYPES.items()}
T_STR, T_ARR, T_U32 = 8, 9, 4

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class Malformed(Exception):
    """What is wrong, without the file name (the caller adds it)."""


class NeedMore(Exception):
    """The walk reached the end of the bytes given, before the end of the file: read more
    and walk again (the header is read in growing pieces, never mapped)."""


@dataclass(frozen=True)
class KV:
    key: str
    type: int            # gguf type id; T_ARR for arrays
    elem_type: int       # arrays: the element type id; scalars: == type
    n: int               # elements (1 for scalars)
    start: int           # file offset of the value (after the type fields / the count)
    end: int             # file offset just past the value


@dataclass(frozen=True)
class TensorSpan:
    name: str
    n_dims: int
    ne: tuple[int, ...]  # ggml order, padded with 1 to 4 entries
    type: int            # enum ggml_type
    offset: int          # relative to the data section
    nbytes: int


@dataclass(frozen=True)
class Layout:
    version: int
    kvs: list[KV]
    tensors: list[TensorSpan]
    alignment: int
    data_offset: int     # file offset of the data section
    size: int            # file size


def _pad(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class _Walk:
    """A cursor over the file's bytes that refuses to read past the end."""

    __slots__ = ("buf", "pos", "end", "size")

    def __init__(self, buf: Any, avail: int, size: int) -> None:
        self.buf, self.pos, self.end, self.size = buf, 0, avail, size

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            if n <= self.size - self.pos:
                raise NeedMore(self.pos + n)
            raise Malformed(f"truncated: {what} needs {n} bytes at offset {self.pos}, "
                            f"the file has {self.size - self.pos} left")

    def fixed(self, st: struct.Struct, what: str) -> int:
        self.need(st.size, what)
        v: int = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return v

    def string(self, what: str) -> bytes:
        n = self.fixed(_U64, f"the length of {what}")
        if n > MAX_STRING:
            raise Malformed(f"{what}: length {n} exceeds ggml's limit of {MAX_STRING} bytes")
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def skip_strings(self, n: int, what: str) -> None:
        # the hot loop of vocabularies (100k+ tokens): one unpack, one add, one compare each.
        # A string longer than what is left ends the loop; when the file is smaller than
        # ggml's string limit, that also enforces the limit.
        buf, pos, end, unpack = self.buf, self.pos, self.end, _U64.unpack_from
        start = pos
        try:
            for i in range(n):
                pos += 8 + unpack(buf, pos)[0]
                if pos > end:
                    break
        except struct.error:     # fewer than 8 bytes left for a length
            pos = end + 1
        if pos > end:
            if end < self.size:
                raise NeedMore(max(pos, end + 1))
            raise Malformed(f"truncated: {what} runs past the end of the file at string {i} of {n}")
        if self.size > MAX_STRING:     # a file this large could hold a string over ggml's limit
            p = start
            for i in range(n):
                ln = unpack(buf, p)[0]
                if ln > MAX_STRING:
                    raise Malformed(f"{what}: string {i} has length {ln}, over ggml's limit")
                p += 8 + ln
        self.pos = pos


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _short(s: str, limit: int = 60) -> str:
    """A name for a message: quoted, and cut when a damaged length made it huge."""
    r = repr(s)
    return r if len(r) <= limit else r[:limit] + f"… ({len(s)} characters)"


def scan(buf: Any, size: int, traits: dict[int, tuple[str, int, int]], max_name: int = 64,
         max_dims: int = 4, max_version: int = 3, avail: int | None = None) -> Layout:
    """Walk the GGUF structure in `buf` (the first `avail` bytes of a file of `size` bytes;
    all of it by default). `traits`: ggml type id -> (name, block size, type size) for the
    types this release knows. Raises Malformed, or NeedMore when `buf` ends before the
    header does."""
    w = _Walk(buf, size if avail is None else avail, size)
    version, n_tensors, n_kv = _header(w, max_version)
    kvs = _key_values(w, n_kv)
    alignment = _alignment(buf, kvs)
    tensors = _tensor_infos(w, n_tensors, traits, max_name, max_dims, alignment)
    data_offset = _data_section(tensors, w.pos, size, alignment)
    return Layout(version, kvs, tensors, alignment, data_offset, size)


def _header(w: _Walk, max_version: int) -> tuple[int, int, int]:
    """(version, tensor count, key-value count) from the 24-byte header, each judged."""
    buf, size = w.buf, w.size
    if size < 24:
        raise Malformed(f"truncated: {size} bytes, a GGUF header takes 24")
    if w.end < 24:
        raise NeedMore(24)
    magic = bytes(buf[0:4])
    if magic != MAGIC:
        raise Malformed(f"not a GGUF file: magic {magic!r}, expected {MAGIC!r}")
    w.pos = 4
    version = w.fixed(_U32, "the version")
    if version & 0xFFFF == 0:
        raise Malformed(f"version {version:#x}: a big-endian file or a damaged header "
                        "(ggml reads little-endian GGUF)")
    if version == 1:
        raise Malformed("GGUF version 1 is no longer supported by ggml")
    if version > max_version:
        raise Malformed(f"GGUF version {version} is newer than this ggml reads ({max_version})")
    n_tensors = w.fixed(_I64, "the tensor count")
    n_kv = w.fixed(_I64, "the key-value count")
    left = size - w.pos
    if n_kv < 0 or n_kv * 14 > left:     # a pair takes at least 8+1 (key) + 4 (type) + 1
        raise Malformed(f"absurd key-value count {n_kv}: the file has {left} bytes after its header")
    if n_tensors < 0 or n_tensors * 24 > left:   # 8 (name) + 4 (dims) + 4 (type) + 8 (offset)
        raise Malformed(f"absurd tensor count {n_tensors}: the file has {left} bytes after its header")
    return version, n_tensors, n_kv


def _key_values(w: _Walk, n_kv: int) -> list[KV]:
    """The `n_kv` key-value pairs: keys unique and without NUL, types known, values inside
    the file (read later, from their span)."""
    kvs, seen = [], set()
    for i in range(n_kv):
        raw = w.string(f"key {i}")
        if not raw:
            raise Malformed(f"key {i} is empty")
        if b"\0" in raw:
            raise Malformed(f"key {i} {_short(_text(raw))} contains a NUL byte")
        key = _text(raw)
        if key in seen:
            raise Malformed(f"duplicate key {_short(key)} (pair {i})")
        seen.add(key)
        t = w.fixed(_I32, f"the type of {_short(key)}")
        et, n = t, 1
        if t == T_ARR:
            et = w.fixed(_I32, f"the element type of {_short(key)}")
            n = w.fixed(_U64, f"the length of {_short(key)}")
            if et == T_ARR or et not in VALUE_TYPES:
                raise Malformed(f"key {_short(key)}: invalid array element type {et}")
            if n > MAX_ARRAY:
                raise Malformed(f"key {_short(key)}: {n} elements exceed ggml's limit of {MAX_ARRAY}")
        elif t not in VALUE_TYPES:
            raise Malformed(f"key {_short(key)}: invalid value type {t}")
        start = w.pos
        if et == T_STR:
            if t == T_ARR:
                w.need(8 * n, f"the {n} strings of {_short(key)}")
                w.skip_strings(n, f"array {_short(key)}")
            else:
                w.string(f"the value of {_short(key)}")
        else:
            nb = VALUE_TYPES[et][1] * n
            w.need(nb, f"the value of {_short(key)} ({n} x {VALUE_TYPES[et][0]})")
            w.pos += nb
        kvs.append(KV(key, t, et, n, start, w.pos))
    return kvs


def _alignment(buf: Any, kvs: list[KV]) -> int:
    """``general.alignment`` (a u32 power of 2), 32 when the file does not say."""
    alignment = 32
    for kv in kvs:
        if kv.key == "general.alignment":
            if kv.type != T_U32:
                name = "arr" if kv.type == T_ARR else VALUE_TYPES[kv.type][0]
                raise Malformed(f"general.alignment must be of type u32, not {name}")
            alignment = int(_U32.unpack_from(buf, kv.start)[0])
            if alignment == 0 or alignment & (alignment - 1):
                raise Malformed(f"general.alignment {alignment} is not a power of 2")
    return alignment


def _tensor_infos(w: _Walk, n_tensors: int, traits: dict[int, tuple[str, int, int]],
                  max_name: int, max_dims: int, alignment: int) -> list[TensorSpan]:
    """The `n_tensors` tensor records: names unique and short enough, shapes and types ggml
    takes, sizes memory can address."""
    tensors, names = [], set()
    for i in range(n_tensors):
        raw = w.string(f"the name of tensor {i}")
        if len(raw) >= max_name:
            raise Malformed(f"tensor {i}: name of {len(raw)} bytes, ggml allows {max_name - 1}")
        if b"\0" in raw:
            raise Malformed(f"tensor {i}: name {_short(_text(raw))} contains a NUL byte")
        name = _text(raw)
        if name in names:
            raise Malformed(f"duplicate tensor name {_short(name)} (tensor {i})")
        names.add(name)
        n_dims = w.fixed(_U32, f"the dimension count of tensor {_short(name)}")
        if n_dims > max_dims:
            raise Malformed(f"tensor {_short(name)}: {n_dims} dimensions, ggml allows {max_dims}")
        ne = [w.fixed(_I64, f"dimension {j} of tensor {_short(name)}") for j in range(n_dims)]
        ne += [1] * (max_dims - n_dims)
        if any(d < 0 for d in ne):
            raise Malformed(f"tensor {_short(name)}: negative dimension in {ne[:n_dims]}")
        count = 1
        for d in ne:
            count *= d if d > 1 else 1
        if count > INT64_MAX:
            raise Malformed(f"tensor {_short(name)}: {ne[:n_dims]} has more elements than int64 holds")
        t = w.fixed(_I32, f"the type of tensor {_short(name)}")
        if t not in traits:
            raise Malformed(f"tensor {_short(name)}: unknown ggml type {t}")
        tname, blck, tsize = traits[t]
        if ne[0] % blck:
            raise Malformed(f"tensor {_short(name)}: {ne[0]} values per row is not a multiple of "
                            f"{tname}'s block size {blck}")
        nbytes = 0 if 0 in ne else ne[0] // blck * tsize * ne[1] * ne[2] * ne[3]
        if nbytes > SIZE_MAX - alignment:
            raise Malformed(f"tensor {_short(name)}: {nbytes} bytes is more than memory can address")
        offset = w.fixed(_U64, f"the offset of tensor {_short(name)}")
        tensors.append(TensorSpan(name, n_dims, tuple(ne), t, offset, nbytes))
    return tensors


def _data_section(tensors: list[TensorSpan], pos: int, size: int, alignment: int) -> int:
    """Where the data section starts (after the records at `pos`, aligned); every tensor in
    file order, padded, inside the file."""
    data_offset = _pad(pos, alignment) if tensors else pos
    if data_offset > size:
        raise Malformed(f"truncated: the data section starts at {data_offset}, "
                        f"the file has {size} bytes")
    expected = 0
    for ts in tensors:
        if ts.offset != expected:
            raise Malformed(f"tensor {_short(ts.name)}: offset {ts.offset}, expected {expected} (ggml "
                            f"needs tensors in file order, each padded to {alignment} bytes)")
        end = data_offset + ts.offset + ts.nbytes
        if end > size:
            raise Malformed(f"truncated: tensor {_short(ts.name)} ends at byte {end}, the file has {size}")
        expected += _pad(ts.nbytes, alignment)
    return data_offset
