"""The tensor records of a Context: ``ggml_init`` chunks (``no_alloc``) opened as they fill.

:class:`Records` is the owned half of :class:`~ggml_py.Context` that holds ggml's memory of
tensor metadata: the chunks, the room left in the newest, the lock ggml's checked ops
(helpers.c) build under, and the walk over every record. What the tensors are and where their
data lives is the Context's (``_context.py``).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

from . import _record_pool
from ._handle import Owned
from ._loader import HELPERS, ffi, lib
from .errors import OutOfMemory, check_ptr

_OVERHEAD = int(lib.ggml_tensor_overhead())


def _records_left_py(raw: Any) -> int:
    """ggml_py_room for bindings without helpers.c."""
    return (int(lib.ggml_get_mem_size(raw)) - int(lib.ggml_used_mem(raw))) // _OVERHEAD - 1


_records_left: Callable[[Any], int] = (lib.ggml_py_room if HELPERS else None) or _records_left_py
# a Context's state for helpers.c's checked ops: its newest chunk and the mutex they build
# under (None for bindings without helpers.c)
_STATE_NEW: Any = lib.ggml_py_ctx_new if HELPERS else None
C_LOCK: Any = lib.ggml_py_ctx_lock if HELPERS else None
C_UNLOCK: Any = lib.ggml_py_ctx_unlock if HELPERS else None


class Records(Owned):
    """Chunks of up to `capacity` tensor records each; a new chunk opens when one fills."""

    _kind = "context"
    # close() frees the memory of the tensors (a Context's buffers, its children) and leaves
    # the records to the collection of the object: a Tensor, a Graph or a context that reads
    # these tensors keeps it, so a thread that checked "open" just before the close, or ggml
    # walking a closed operand's record, reads a record instead of freed memory (the records
    # then raise ClosedError)
    _frees_at_close = False

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        first = self._new_chunk()
        # every chunk (ggml_context), the first included: a new one opens when the last
        # fills. Plain handles, freed with this object (never with a Python object of their
        # own: one that kept this Context as its parent would make a cycle, and a Context of
        # more than one chunk would wait for the cyclic collector to give its memory back)
        self._chunks: list[Any] = [first]
        super().__init__(first, functools.partial(_record_pool.release_all, self._chunks))
        self._spans = [self._span(first)]
        self._head = first                 # the newest chunk, where tensors are made
        # the checked ops' side (helpers.c): the newest chunk, and a mutex held by a checked
        # op while it builds and by this object wherever it builds in, walks or closes its
        # chunks (_records), so ggml never sees two threads in one chunk. The handle that
        # every ggml_py_* checked op takes first (None for bindings without helpers.c):
        # read it (the ops call their helper with it: ops/_common.CHECKED_OPS), never assign it
        self.checked_state: Any = None
        if _STATE_NEW is not None:
            st = check_ptr(_STATE_NEW(first),
                           "Context: no memory for its state", OutOfMemory)
            self.checked_state = ffi.gc(st, lib.ggml_py_ctx_free)
            self.on_close(self._refuse_checked_ops)

    def _refuse_checked_ops(self) -> None:
        """The first step of close(): checked ops refuse to build here from now on."""
        st = self.checked_state
        C_LOCK(st)
        lib.ggml_py_ctx_set_head(st, ffi.NULL)
        C_UNLOCK(st)

    def _new_chunk(self) -> Any:
        raw = _record_pool.new(_OVERHEAD * (self._capacity + 64))
        if raw == ffi.NULL:
            raise OutOfMemory(f"Context: ggml_init could not reserve room for {self._capacity} "
                              "tensors")
        return raw

    @staticmethod
    def _span(raw: Any) -> tuple[int, int]:
        base = int(ffi.cast("uintptr_t", lib.ggml_get_mem_buffer(raw)))
        return base, base + int(lib.ggml_get_mem_size(raw))

    def _room(self, n: int = 8) -> Any:
        """The raw chunk with room for `n` more tensors (opening a new chunk when needed).
        Callers hold the lock. Room is what ggml says is left (``_records_left``), the one
        count both the Python path and the checked ops read."""
        self.ptr                                # (ClosedError once closed)
        if _records_left(self._head) < n:
            raw = self._new_chunk()
            self._chunks.append(raw)
            self._spans.append(self._span(raw))
            self._head = raw
            if self.checked_state is not None:         # (the caller holds _records)
                lib.ggml_py_ctx_set_head(self.checked_state, raw)
        return self._head

    @contextlib.contextmanager
    def _records(self) -> Iterator[None]:
        """This context's lock, and the mutex its checked ops build under: held to build in,
        walk or change its chunks. Not held while Python code that could reach this context
        again runs (views' init, buffers, finalizers): the mutex is not re-entrant."""
        with self._lock:
            st = self.checked_state
            if st is None:
                yield
                return
            C_LOCK(st)
            try:
                yield
            finally:
                C_UNLOCK(st)

    def _raws(self) -> list[Any]:
        self.ptr                                # (ClosedError once closed)
        return list(self._chunks)

    def _chunk_raw_tensors(self, raw: Any) -> list[Any]:
        out = []
        p = lib.ggml_get_first_tensor(raw)
        while p != ffi.NULL:
            out.append(p)
            p = lib.ggml_get_next_tensor(raw, p)
        return out

    def n_tensors(self) -> int:
        """How many tensors (ops, views, inputs) this context holds."""
        with self._records():
            # each record takes ggml_tensor_overhead() exactly (every pinned release), and a
            # Context's chunks hold tensor records only
            return sum(int(lib.ggml_used_mem(r)) for r in self._raws()) // _OVERHEAD

    def spans(self) -> list[tuple[int, int]]:
        """The address ranges of this context's tensor records, one per chunk."""
        return list(self._spans)

    def owns(self, raw_tensor: Any) -> bool:
        """Whether the raw tensor's metadata lives in this context's memory."""
        a = int(ffi.cast("uintptr_t", raw_tensor))
        return any(lo <= a < hi for lo, hi in self._spans)


__all__ = ["Records"]
