"""ggml's own log, through Python's :mod:`logging`: the logger ``"ggml"``.

ggml reports through one callback (``ggml_log_set``). Installed when the library loads, it
hands each line to ``logging.getLogger("ggml")`` at the mapped level (ggml's DEBUG, INFO,
WARN, ERROR; CONT continues the line before), so scripts, notebooks and pytest's ``caplog``
see it, and a user silences or raises it the usual way
(``logging.getLogger("ggml").setLevel(logging.ERROR)``). As a library should, the logger has
a ``NullHandler`` only: nothing is printed until the program configures logging
(``logging.basicConfig()``).

The callback never raises into C (every error is swallowed: a log line is not worth a
crash), and ggml's default logger is put back at interpreter exit, before Python's objects
go away, so a late line from C never calls into a finalized interpreter.
"""
from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

logger = logging.getLogger("ggml")
logger.addHandler(logging.NullHandler())

#: ggml's levels (enum ggml_log_level) -> logging's; 5 (CONT) continues the previous line
LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING,
          4: logging.ERROR}
_CONT = 5
# lines ggml logs at INFO that are chatter for a Python user: debug level here
_QUIET = ("ggml_graph_dump_dot:",)

_state = threading.local()       # per thread: (level, text so far) of an unfinished line
_installed: list[Any] = []       # the callback, kept alive for the life of the process
_routing = [False]               # whether ggml's log goes to it now (False once exited)


def _emit(level: int, text: str) -> None:
    pending = getattr(_state, "pending", None)
    if level == _CONT and pending is not None:
        level, text = pending[0], pending[1] + text
    elif pending is not None:                 # a new line while one was unfinished
        _send(pending[0], pending[1])
    if not text.endswith("\n"):
        _state.pending = (level, text)
        return
    _state.pending = None
    _send(level, text)


def _send(level: int, text: str) -> None:
    text = text.rstrip("\n")
    if not text:
        return
    py_level = LEVELS.get(level, logging.INFO)
    if text.startswith(_QUIET):
        py_level = logging.DEBUG
    if logger.isEnabledFor(py_level):
        logger.log(py_level, "%s", text)


def _on_log(level: Any, text: Any, user_data: Any) -> None:
    try:
        if text:
            _emit(int(level), _ffi.string(text).decode("utf-8", "replace"))
    except BaseException:        # never into C (a closed stream, a shutdown, a bad handler)
        pass


def _ignore(*_: Any) -> None:     # cffi's onerror: whatever escaped is dropped
    return None


_ffi: Any = None


def install(ffi: Any, lib: Any) -> None:
    """Route ggml's log to the ``ggml`` logger (once per process; the loader calls it)."""
    global _ffi
    if _installed:
        return
    _ffi = ffi
    cb = ffi.callback("void(enum ggml_log_level, const char *, void *)", _on_log,
                      onerror=_ignore)
    _installed.append(cb)
    lib.ggml_log_set(cb, ffi.NULL)
    _routing[0] = True
    atexit.register(_uninstall, lib, ffi)


def _uninstall(lib: Any, ffi: Any) -> None:
    _routing[0] = False
    try:
        lib.ggml_log_set(ffi.NULL, ffi.NULL)      # ggml's default: stderr
    except BaseException:
        pass


def current(ffi: Any) -> Any:
    """The log callback ggml_py has given ggml now (NULL: ggml's own printer), for code that
    sets another for a while and puts this one back on releases without ``ggml_log_get``."""
    return _installed[0] if _installed and _routing[0] else ffi.NULL


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler of :func:`to_stderr` (added once)."""


def to_stderr(level: int = logging.WARNING) -> None:
    """Print ggml's lines at `level` and above on stderr, bare, as ggml itself would: for child
    processes whose parent reads ggml's messages there (compare's workers)."""
    if any(isinstance(h, _StderrHandler) for h in logger.handlers):
        return
    handler = _StderrHandler()                   # sys.stderr at each emit
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.setLevel(level)
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)


__all__ = ["logger", "install", "LEVELS", "to_stderr"]
