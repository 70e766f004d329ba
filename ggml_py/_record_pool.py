"""The record pool: ggml contexts of metadata only (``no_alloc``: tensor records, graph
memory), made and freed here so that they are reused.

A chunk freed by :func:`release` is reset (``ggml_reset``) and kept for the next
:func:`new` of its size, up to :func:`pool_limit` bytes in all (32 MiB unless set). A program
that builds its graph again and again (a decoder's graph for each token, a benchmark's loop)
then writes its records into memory it has touched before: freed back to the C allocator,
chunks of the default size go back to the kernel and return as fresh pages, whose faults are
a sizeable part of building a graph (docs/architecture.md, "Why").

A chunk comes back here only when nothing can read it any more (a Context's chunks when the
Context object is collected, a Graph's when the Graph is), so reusing it is as safe as the
C allocator reusing it. Bindings without ``ggml_reset`` free every chunk.
"""
from __future__ import annotations

import threading
from typing import Any

from . import _features
from ._loader import ffi, lib
from .errors import InvalidArgument, InvalidType

_RESET: Any = lib.ggml_reset if _features.CONTEXT_RESET else None
_lock = threading.Lock()
_pool: dict[int, list[Any]] = {}      # mem_size -> reset chunks of that size
_held = 0                             # bytes in _pool
_limit = 32 << 20


def _size(mem_size: int) -> int:
    # a multiple of 64: what ggml_get_mem_size reports back (ggml pads to 16)
    return (mem_size + 63) & ~63


def new(mem_size: int) -> Any:
    """A ``no_alloc`` ggml context of `mem_size` bytes (at least), from the pool when it holds
    one of that size; NULL when ggml_init fails."""
    global _held
    size = _size(mem_size)
    with _lock:
        chunks = _pool.get(size)
        if chunks:
            _held -= size
            raw = chunks.pop()
            if not chunks:
                del _pool[size]        # (graphs' sizes vary: no empty list kept per size)
            return raw
    params = ffi.new("struct ggml_init_params *",
                     {"mem_size": size, "mem_buffer": ffi.NULL, "no_alloc": True})
    return lib.ggml_init(params[0])


def release(raw: Any) -> None:
    """Give back a context from :func:`new` that nothing reads any more: kept for reuse while
    the pool has room, freed otherwise. Safe in finalizers (it never waits for the lock:
    a collection inside :func:`new` frees instead)."""
    global _held
    size = int(lib.ggml_get_mem_size(raw))
    if _RESET is not None and _lock.acquire(blocking=False):
        try:
            if raw in _pool.get(size, ()):   # given back twice (never expected): kept once,
                return                         # so no two contexts get the same chunk
            if _held + size <= _limit:
                _RESET(raw)
                _pool.setdefault(size, []).append(raw)
                _held += size
                return
        finally:
            _lock.release()
    lib.ggml_free(raw)


def release_all(raws: list[Any], _first: Any = None) -> None:
    """:func:`release` each of `raws` (a Context's chunks; `_first` is the handle an Owned
    finalizer passes, the first of them)."""
    for raw in raws:
        release(raw)


def pool_limit(n_bytes: int | None = None) -> int:
    """The bytes of freed metadata chunks kept for reuse (32 MiB by default); with `n_bytes`,
    set it (0 keeps none) and free what is over it. Returns the limit in force before."""
    global _held, _limit
    old = _limit
    if n_bytes is not None:
        if isinstance(n_bytes, bool) or not isinstance(n_bytes, int):
            raise InvalidType(f"pool_limit: n_bytes must be an int, not {type(n_bytes).__name__}")
        if n_bytes < 0:
            raise InvalidArgument(f"pool_limit: n_bytes must be >= 0, got {n_bytes}")
        free = []
        with _lock:
            _limit = n_bytes
            for size in sorted(_pool, reverse=True):
                chunks = _pool[size]
                while chunks and _held > _limit:
                    free.append(chunks.pop())
                    _held -= size
                if not chunks:
                    del _pool[size]
        for raw in free:
            lib.ggml_free(raw)
    return old


def pooled() -> int:
    """Bytes of chunks kept for reuse now."""
    return _held
