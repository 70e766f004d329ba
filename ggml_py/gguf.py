"""GGUF files through ggml's own gguf API: read one, load its tensors onto a backend, write one.

    import ggml_py as gg
    with gg.gguf.read("model.gguf") as f:
        f.metadata["general.architecture"]          # key -> Python value
        f.metadata_types["tokenizer.ggml.tokens"]   # 'arr[str]': the GGUF value type
        [(t.name, t.shape, t.type) for t in f.tensors]
        weights = f.load(gg.device("CPU").backend())   # {name: Tensor}; zero copy on CPU
    gg.gguf.write("out.gguf", {"general.name": "demo"}, {"w": np.ones((2, 3), np.float32)})

Every file is walked in Python first (:mod:`ggml_py._gguf_check`), then parsed by ggml from the
same memory map: a damaged or hostile file raises :class:`GGUFError` naming the file and what is
wrong, never reaches a ggml code path that could abort, and never allocates more than it holds.
"""
from __future__ import annotations

import errno
import mmap
import os
import stat
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from . import _gguf_check as chk
from . import _features, _log
from ._handle import Owned
from ._loader import ffi, lib
from .errors import ClosedError, GGMLError, InvalidType

if TYPE_CHECKING:
    from ._tensor import Tensor
    from ._types import GGMLType

__all__ = ["read", "write", "GGUFFile", "Metadata", "TensorInfo", "GGUFError", "VALUE_TYPES"]


class GGUFError(GGMLError, ValueError):
    """A file that is not a GGUF file ggml can read: the message names the file and the fault."""


#: GGUF value type names (``gguf_type_name``), arrays written ``arr[<element type>]``
VALUE_TYPES = ("u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "u64", "i64", "f64")
_NP = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16, "i16": np.int16, "u32": np.uint32,
       "i32": np.int32, "f32": np.float32, "bool": np.bool_, "u64": np.uint64,
       "i64": np.int64, "f64": np.float64}


def _traits() -> dict[int, tuple[str, int, int]]:
    import ggml_py as gg
    out = {}
    for t in gg.TYPES.values():
        if t.block_size > 0:
            out[int(t)] = (t.name, t.block_size, t.type_size)
    return out


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the file describes it. ``shape`` is numpy order (slowest axis first) with
    as many axes as the file stores (size-1 ones included); ``type`` the ggml type name;
    ``offset`` the absolute file offset of its data (gguf-py's ``data_offset``).

        >>> [(t.name, t.shape, t.type) for t in gg.gguf.read(path).tensors]   # doctest: +SKIP
        [('w', (4, 8), 'f32')]
    """
    name: str
    shape: tuple[int, ...]
    type: str
    offset: int
    nbytes: int

    @property
    def ggml_type(self) -> "GGMLType":
        """The tensor's type as a ggml_py GGMLType (``gg.f32``...)."""
        import ggml_py as gg
        return gg.TYPES[self.type]


# -- reading ----------------------------------------------------------------------------------

_log_lock = threading.Lock()
_log_lines: list[str] | None = None


def _on_log(level: Any, text: Any, user_data: Any) -> None:
    if _log_lines is not None and text != ffi.NULL:
        _log_lines.append(ffi.string(text).decode("utf-8", "replace"))
    elif text != ffi.NULL:
        sys.stderr.write(ffi.string(text).decode("utf-8", "replace"))


# kept for the life of the process: a callback another thread restored late stays valid
_capture_log = ffi.callback("void(enum ggml_log_level, const char *, void *)")(_on_log)


def init_from_bytes(ptr: Any, size: int, fd: int, params: Any) -> Any:
    """gguf_init_from_buffer; releases before 0.15 have only gguf_init_from_file, which reads
    the same open file through /dev/fd (the bytes the check scanned; the file is kept open
    and checked unchanged)."""
    if _features.GGUF_FROM_BUFFER:
        return lib.gguf_init_from_buffer(ptr, size, params)
    return lib.gguf_init_from_file(f"/dev/fd/{fd}".encode(), params)


def _ggml_parse(ptr: Any, size: int, fd: int) -> tuple[Any, str]:
    """gguf_init_from_buffer with ggml's log captured: (context or NULL, log text)."""
    global _log_lines
    params = ffi.new("struct gguf_init_params *", {"no_alloc": True, "ctx": ffi.NULL})
    with _log_lock:
        old_cb, old_ud = ffi.new("ggml_log_callback *"), ffi.new("void **")
        if _features.LOG_GET:
            lib.ggml_log_get(old_cb, old_ud)
        else:       # (0.9.x has no ggml_log_get: put back what ggml_py gave ggml)
            old_cb[0] = _log.current(ffi)
        _log_lines = []
        lib.ggml_log_set(_capture_log, ffi.NULL)
        try:
            raw = init_from_bytes(ptr, size, fd, params[0])
        finally:
            lib.ggml_log_set(old_cb[0], old_ud[0])
            lines, _log_lines = _log_lines, None
    return raw, "".join(lines).strip()


def _open_regular(path: str) -> BinaryIO:
    """`path` opened for reading, when it is a regular file: a FIFO would block the open (and
    every read) until some writer came, a device or directory is no GGUF file. Opened
    without blocking, checked on the descriptor (no race with a rename), then made blocking."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "not a file")
            raise GGUFError(f"{path}: not a regular file ({kind}); GGUF files are read from "
                            "regular files only")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


#: bytes read for the header at first (a 256k-token vocabulary's header is about 8 MiB): the
#: walk starts again on more when the header is longer
HEAD = 16 << 20

#: arrays longer than this are read from ggml when first used (a vocabulary's 100k+ strings)
LAZY = 1024


class Metadata(Mapping[str, Any]):
    """A GGUF file's key -> value, in file order. Scalars and short arrays are read when the
    file is opened, long arrays (vocabularies) on first use: read them before closing the
    file, or take ``dict(f.metadata)``."""

    def __init__(self, owner: "GGUFFile", values: dict[str, Any],
                 pending: dict[str, tuple[int, chk.KV]]) -> None:
        self._owner, self._values, self._pending = owner, values, pending
        self._order = [k for k in owner.metadata_types]

    def __getitem__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            if key not in self._pending:
                raise
        owner = self._owner
        with owner.lock:           # close() takes it too: ggml's context stays while read
            if key in self._values:          # another thread read it meanwhile
                return self._values[key]
            i, span = self._pending[key]
            if owner.closed:
                raise ClosedError(f"{owner.path}: {key!r} was not read before the file was "
                                  "closed (take dict(f.metadata) while it is open)")
            v = self._values[key] = _value(owner.ptr, i, span, owner._head)
            del self._pending[key]
        return v

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._values or key in self._pending

    def __repr__(self) -> str:
        def show(k: str) -> str:
            if k in self._values:
                return repr(self._values[k])
            return f"<{self._owner.metadata_types[k]} x {self._pending[k][1].n}, not read yet>"
        return "{" + ", ".join(f"{k!r}: {show(k)}" for k in self._order) + "}"


class GGUFFile(Owned):
    """An open GGUF file (from :func:`read`): ``metadata``, ``metadata_types``, ``tensors``,
    ``version``, ``alignment``, ``data_offset``; :meth:`load` puts tensors on a backend.
    Owns ggml's ``gguf_context``, the open file and a read-only mapping of it: ``close()``
    (or ``with``) frees them; tensors loaded without a copy have a private copy-on-write
    mapping of their own, which lives as long as they do."""

    _kind = "GGUF file"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path: str = os.fspath(path)
        # the file stays open: loads read this very file again, whatever the path names later
        self._file: BinaryIO | None = _open_regular(self.path)
        try:
            size = os.fstat(self._file.fileno()).st_size
            if size < 24:
                raise self._error(f"truncated: {size} bytes, a GGUF header takes 24")
            head, layout = self._read_header(size)
            # ggml parses the very bytes just checked, from private memory (no mapping of a
            # file someone else may truncate: that would be SIGBUS at the next read)
            with ffi.from_buffer("void *", head) as ptr:
                raw, log = _ggml_parse(ptr, len(head), self._file.fileno())
            if raw == ffi.NULL:
                raise self._error("ggml's parser refused it" + (f": {log}" if log else ""))
        except BaseException:
            self._release_file()
            raise
        self._head = head
        super().__init__(raw, lib.gguf_free)
        # close() frees ggml's context, then closes the file (tensors loaded with
        # ``copy=False`` keep their own mapping)
        self.on_close(self._release_file, after_free=True)
        try:
            self._read(raw, layout)
        except BaseException:
            self.close()
            raise
        self.size = size

    def _read_header(self, size: int) -> tuple[bytes, chk.Layout]:
        """The header (key-values and tensor infos, up to the data section), read with pread
        (:data:`HEAD` bytes, then four times more while the walk needs more), and its layout."""
        assert self._file is not None
        fd, want = self._file.fileno(), min(size, HEAD)
        head = b""
        while True:
            if len(head) < want:
                head += self._pread(fd, want - len(head), len(head))
            try:
                layout = chk.scan(head, size, _traits(), int(lib.GGML_MAX_NAME),
                                  int(lib.GGML_MAX_DIMS), int(lib.GGUF_VERSION), avail=len(head))
            except chk.NeedMore as more:
                want = min(size, max(int(more.args[0]), 4 * len(head)))
                continue
            except chk.Malformed as e:
                raise self._error(str(e)) from None
            if len(head) < layout.data_offset:      # ggml seeks to the data section's start
                head += self._pread(fd, layout.data_offset - len(head), len(head))
            return head, layout

    def _pread(self, fd: int, n: int, offset: int) -> bytes:
        """`n` bytes at `offset`, or GGUFError when the file ends first (it shrank)."""
        out = bytearray()
        while len(out) < n:
            part = os.pread(fd, n - len(out), offset + len(out))
            if not part:
                raise self._error(f"the file changed while it was read (it ends at byte "
                                  f"{offset + len(out)})")
            out += part
        return bytes(out)

    def _error(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def _read(self, raw: Any, layout: chk.Layout) -> None:
        self.version = int(lib.gguf_get_version(raw))
        self.alignment = int(lib.gguf_get_alignment(raw))
        self.data_offset = int(lib.gguf_get_data_offset(raw))
        if not layout.tensors and self.data_offset == -(-layout.data_offset // self.alignment) \
                * self.alignment:
            # a file without tensors may end unpadded; ggml before 0.15 seeks to the padded
            # offset past its end and reports that
            self.data_offset = layout.data_offset
        if (self.version, self.alignment, self.data_offset) != \
                (layout.version, layout.alignment, layout.data_offset):
            raise self._error("ggml and ggml_py's check disagree on the header")
        n_kv = int(lib.gguf_get_n_kv(raw))
        if n_kv != len(layout.kvs):
            raise self._error(f"ggml read {n_kv} keys, the check {len(layout.kvs)}")
        self.metadata_types: dict[str, str] = {}
        values: dict[str, Any] = {}
        pending: dict[str, tuple[int, chk.KV]] = {}
        for i, span in enumerate(layout.kvs):
            if ffi.string(lib.gguf_get_key(raw, i)).decode("utf-8", "surrogateescape") != span.key \
                    or int(lib.gguf_get_kv_type(raw, i)) != span.type:
                raise self._error(f"ggml and the check disagree on key {i} ({span.key!r})")
            et = chk.VALUE_TYPES[span.elem_type][0]
            self.metadata_types[span.key] = f"arr[{et}]" if span.type == chk.T_ARR else et
            if span.n > LAZY:
                pending[span.key] = (i, span)
            else:
                values[span.key] = _value(raw, i, span, self._head)
        self.metadata = Metadata(self, values, pending)
        if int(lib.gguf_get_n_tensors(raw)) != len(layout.tensors):
            raise self._error("ggml and the check disagree on the tensor count")
        self.tensors: list[TensorInfo] = []
        traits = _traits()
        for i, ts in enumerate(layout.tensors):
            ne = (tuple(lib.gguf_get_tensor_ne(raw, i)[0:4]) if _features.GGUF_TENSOR_NE
                  else tuple(ts.ne))
            if (ffi.string(lib.gguf_get_tensor_name(raw, i)).decode("utf-8", "surrogateescape"),
                    int(lib.gguf_get_tensor_type(raw, i)), ne, int(lib.gguf_get_tensor_offset(raw, i)),
                    int(lib.gguf_get_tensor_size(raw, i))) != \
                    (ts.name, ts.type, ts.ne, ts.offset, ts.nbytes):
                raise self._error(f"ggml and the check disagree on tensor {ts.name!r}")
            self.tensors.append(TensorInfo(ts.name, tuple(reversed(ts.ne[:ts.n_dims])),
                                           traits[ts.type][0], self.data_offset + ts.offset,
                                           ts.nbytes))

    def _private_pages(self) -> mmap.mmap:
        """A new private copy-on-write mapping of the file, for tensors placed on it
        (``load(copy=False)``): writes to them touch neither the file nor the tensors of
        another load."""
        return mmap.mmap(self._unchanged().fileno(), 0, access=mmap.ACCESS_COPY)

    def _unchanged(self) -> BinaryIO:
        """The open file, once checked to have kept its size (a mapping faults on pages past a
        new end of file)."""
        if self._file is None or self._raw is None:
            raise ClosedError(f"{self.path}: the file is closed")
        if os.fstat(self._file.fileno()).st_size != self.size:
            raise GGMLError(f"{self.path}: the file changed size since it was opened; "
                            "open it again")
        return self._file

    def _read_into(self, out: np.ndarray[Any, Any], offset: int) -> None:
        """Fill `out` (uint8) from the file at `offset` with pread: a file that shrank since
        gives a short read, raised as GGMLError (a mapping would fault)."""
        fd, view, done = self._unchanged().fileno(), out.data.cast("B"), 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n <= 0:
                raise GGMLError(f"{self.path}: the file changed since it was opened (it ends "
                                f"at byte {offset + done}); open it again")
            done += n

    def _release_file(self) -> None:
        fh, self._file = self._file, None
        if fh is not None:
            fh.close()

    def __getitem__(self, key: str) -> Any:
        return self.metadata[key]

    def load(self, target: Any, names: "list[str] | None" = None, *,
             progress: Any = "auto", copy: bool = True) -> "dict[str, Tensor]":
        """Put tensors (all, or those in `names`) on `target`: a Backend (its default buffer
        type), Device (its buffer type) or BufferType. Returns ``{name: Tensor}``. The bytes
        are copied into one buffer, read from the file in chunks: the tensors do not depend on
        the file afterwards. ``copy=False`` places them on a private mapping of the file
        instead where the memory allows (host memory that wraps a pointer, every tensor
        aligned as it needs): no copy, but the file must then not be truncated or rewritten in
        place while they live (a mapped page past a new end of file kills the process with
        SIGBUS; ``gg.gguf.write`` replaces files, it never rewrites them). `progress`: True
        prints a line to stderr, a callable gets ``(bytes_done, bytes_total)``, "auto" prints
        for uploads over 256 MiB."""
        from ._gguf_load import load
        if not isinstance(copy, bool):
            raise InvalidType(f"load: copy must be True or False, not {copy!r}")
        with self._lock:            # close() waits for the load to end
            self.ptr   # refuse a closed file
            return load(self, target, names, progress, copy)

    def __repr__(self) -> str:
        if self.closed:
            return f"<GGUFFile {self.path!r} closed>"
        return (f"<GGUFFile {self.path!r} v{self.version} {len(self.metadata)} keys "
                f"{len(self.tensors)} tensors>")

    def _repr_html_(self) -> str:
        from ._display import gguf_html
        return gguf_html(self)


def _value(raw: Any, i: int, span: chk.KV, mapped: Any) -> Any:
    """The value of key `i` through ggml's getters (the file's bytes only for strings with a
    NUL inside, where ggml's C string stops early)."""
    et = chk.VALUE_TYPES[span.elem_type][0]
    if span.type != chk.T_ARR:
        if et == "str":
            s = ffi.string(lib.gguf_get_val_str(raw, i))
            if len(s) != span.end - span.start - 8:     # a NUL inside: ggml's C string stops there
                s = mapped[span.start + 8:span.end]
            return s.decode("utf-8", "surrogateescape")
        v = getattr(lib, f"gguf_get_val_{et}")(raw, i)
        return v if et != "bool" else bool(v)
    n = int(lib.gguf_get_arr_n(raw, i))
    if et == "str":
        get, string = lib.gguf_get_arr_str, ffi.string
        out = [string(get(raw, i, j)) for j in range(n)]
        if sum(map(len, out)) != span.end - span.start - 8 * n:   # a NUL inside a string
            out, pos = [], span.start
            for _ in range(n):
                ln = int.from_bytes(mapped[pos:pos + 8], "little")
                out.append(mapped[pos + 8:pos + 8 + ln])
                pos += 8 + ln
        return [s.decode("utf-8", "surrogateescape") for s in out]
    dt = np.dtype(_NP[et])
    if n == 0:
        return np.empty(0, dt)
    data = ffi.buffer(lib.gguf_get_arr_data(raw, i), n * dt.itemsize)
    if et == "bool":
        return np.frombuffer(data, dtype=np.uint8) != 0
    return np.frombuffer(data, dtype=dt).copy()


def read(path: str | os.PathLike[str]) -> GGUFFile:
    """Open a GGUF file: metadata and tensor infos read through ggml's gguf API.
    Raises :class:`GGUFError` for a damaged or malformed file, ``OSError`` when it cannot be
    opened."""
    return GGUFFile(path)


def write(path: str | os.PathLike[str], metadata: dict[str, Any] | None = None,
          tensors: Any = None, *, types: dict[str, str] | None = None) -> None:
    """Write a GGUF file with ggml's gguf API (metadata and layout) and the tensors' bytes.

    `metadata`: key -> value; Python ``int`` is written as i32 (i64/u64 when it does not fit),
    ``float`` as f32, ``str``, ``bool``, numpy scalars and 1-D arrays by their dtype, lists of
    one of those as arrays; `types` (key -> "u64", "arr[i32]", ... as in ``metadata_types``)
    overrides. ``general.alignment`` sets the alignment (a power of 2, u32).
    `tensors`: name -> numpy array (f32, f16, f64, i8..i64), ggml_py Tensor (any type; its
    bytes are read from its device), or ``(ggml type, shape, uint8 bytes)`` for raw (e.g.
    quantized) data; also a list of (name, value) pairs. The file appears whole or not at all.
    """
    from ._gguf_write import write as _write
    _write(path, metadata or {}, tensors or {}, types or {})


def __dir__() -> list[str]:       # dir() and help() show the module's API only
    return sorted(__all__)
