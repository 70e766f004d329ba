"""What the package's objects ask of each other, declared once, below every class that
implements it.

The house's modules import one way (import-linter's layers in pyproject.toml): a module that
must name an object of a class defined above it names one of these interfaces instead, so that
even the imports read only by type checkers run one way (tests/test_import_graph.py).

- The protocols (``typing.Protocol``) are for annotations: what a backend knows of its device,
  what a tensor knows of its context. Nothing checks them at run time.
- The declared kinds (:class:`Queue`, :class:`Waitable`, :class:`Computable`,
  :class:`TensorLike`) are plain base classes, named as bases by the classes that implement
  them; an argument's kind is asked with ``isinstance`` against them, never with an attribute
  probe.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Protocol

import numpy as np

# -- for annotations ---------------------------------------------------------------------------


class BufferTypeLike(Protocol):
    """A buffer type, as the buffers and backends it made and the contexts placing tensors
    there see it (``_device.BufferType``)."""

    @property
    def ptr(self) -> Any: ...
    @property
    def name(self) -> str: ...
    @property
    def alignment(self) -> int: ...
    @property
    def max_size(self) -> int: ...
    @property
    def is_host(self) -> bool: ...
    @property
    def device(self) -> Any: ...
    def alloc(self, nbytes: int) -> Any: ...
    def require_plain_bytes(self, what: str) -> None: ...
    @property
    def admits(self) -> bool: ...
    def admit(self, tensors: list[Any]) -> None: ...


class DeviceLike(Protocol):
    """A device, as its backends and events see it (``_device.Device``)."""

    @property
    def ptr(self) -> Any: ...
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def registry(self) -> Any: ...
    @property
    def caps(self) -> Any: ...
    @property
    def memory(self) -> tuple[int, int]: ...
    @property
    def buffer_type(self) -> BufferTypeLike: ...
    @property
    def host_buffer_type(self) -> BufferTypeLike | None: ...
    def require_events(self) -> None: ...
    def backend(self, n_threads: int | None = None, params: str | None = None) -> Any: ...
    def event(self) -> Any: ...
    def buffer_from_host(self, array: np.ndarray) -> Any: ...


class TensorHome(Protocol):
    """A context, as its tensors and the op builders see it (``_context.Context``): where a
    result is built, whose lock a transfer holds, which books record written tensors."""

    checked_state: Any
    books: Any
    rewired: Any
    # the raw context, None once closed: read where a tensor checks its context on the paths
    # that build graphs, on which a property call would cost (``closed`` says the same)
    _raw: Any

    @property
    def closed(self) -> bool: ...
    @property
    def lock(self) -> threading.RLock: ...
    def build(self, fn: Callable[..., Any], args: Iterable[Any], ndim: int | None,
              uses: Iterable[Any] = (), room: int = 4, *, view: bool = False,
              like: Any = None) -> Any: ...
    def tensor(self, type: Any, shape: Any, name: str | None = None) -> Any: ...
    def from_numpy(self, array: Any, name: str | None = None) -> Any: ...
    def constant(self, array: Any) -> Any: ...
    def wrap(self, p: Any, ndim: int | None = None) -> Any: ...
    def wrap_raw(self, p: Any) -> Any: ...
    def contexts(self, include_closed: bool = False) -> list[Any]: ...
    def keep(self, obj: Any) -> None: ...
    def export(self) -> Any: ...
    def own(self, buffer: Any) -> None: ...
    def alloc(self, backend_or_buffer_type: Any) -> list[Any]: ...
    def close(self) -> None: ...


# -- declared kinds, asked with isinstance ------------------------------------------------------
# Plain base classes, named as bases by the classes that implement them: ``isinstance``
# against one costs what it costs against any class (an ABC's check takes a few times as long,
# a runtime-checkable Protocol's microseconds, and it reads properties that may raise).


class Queue:
    """A backend's queue, as transfers and events use it (``_backend.Backend``)."""

    __slots__ = ()

    lock: threading.RLock       # held while ggml uses the queue (Owned.lock)

    @property
    def ptr(self) -> Any:
        raise NotImplementedError

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        raise NotImplementedError

    def ensure_alive(self) -> None:
        """RPCError when its server died (before any call that would abort the process)."""
        raise NotImplementedError

    def keep_until_synchronized(self, obj: Any) -> None:
        """Keep `obj` (host arrays, tensors, events) alive until the queue synchronizes."""
        raise NotImplementedError

    def can_free(self) -> bool:
        """Whether memory may still be freed through the queue's device (not when its RPC
        server died: ggml's client would abort the process)."""
        raise NotImplementedError


class Waitable:
    """An event a queue can wait on (``_event.Event``)."""

    __slots__ = ()

    @property
    def ptr(self) -> Any:
        raise NotImplementedError

    @property
    def device(self) -> DeviceLike:
        raise NotImplementedError

    def add_waiter(self, queue: Queue) -> None:
        """Note that `queue` waits on the event (its close synchronizes that queue first)."""
        raise NotImplementedError


class Computable:
    """What a backend computes (``_graph.Graph``)."""

    __slots__ = ()

    def compute_on(self, backend: Any, *, asynchronous: bool) -> None:
        """Compute on `backend`, waiting for it unless `asynchronous`."""
        raise NotImplementedError


class TensorLike:
    """A tensor, as the layers below :mod:`ggml_py._tensor_base` see it (transfers, the books
    of written values, backends): ``_tensor_base.TensorBase`` implements every member."""

    __slots__ = ()

    ctx: TensorHome
    # read directly by the op builders on the paths that build graphs, where a property call
    # would cost a tenth of an op: the raw tensor, unchecked (for callers that checked the
    # context is open), and the facts a tensor caches (None until read; `_ndim` always an int)
    _p: Any
    _ndim: int
    _ne: tuple[int, ...] | None
    _nb: tuple[int, ...] | None

    @property
    def ptr(self) -> Any:
        raise NotImplementedError

    def require_memory(self, what: str) -> Any:
        """The raw tensor, once it is sure to have live memory."""
        raise NotImplementedError

    def whole_transfer(self) -> tuple[Any, int] | None:
        raise NotImplementedError

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def type(self) -> Any:
        raise NotImplementedError

    @property
    def dtype(self) -> Any:
        raise NotImplementedError

    @property
    def shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def ne(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def nb(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def ndim(self) -> int:
        raise NotImplementedError

    @property
    def size(self) -> int:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError

    @property
    def data(self) -> int | None:
        raise NotImplementedError

    @property
    def is_contiguous(self) -> bool:
        raise NotImplementedError

    @property
    def is_host(self) -> bool:
        raise NotImplementedError

    def numpy(self, *, copy: bool | None = None) -> np.ndarray:
        raise NotImplementedError


__all__ = ["BufferTypeLike", "DeviceLike", "TensorHome", "Queue", "Waitable", "Computable",
           "TensorLike"]
