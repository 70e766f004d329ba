"""Progress of a long build: one line per phase, updated in place on a terminal and as
periodic plain lines in logs.

Under pip, stdout is captured (shown only with -v or on failure); with
``GGML_PY_PROGRESS_TTY=1`` (set by setup.py) the in-place line goes to the controlling terminal
when there is one, so an interactive ``pip install`` still shows what is happening.
"""
from __future__ import annotations

import os
import sys
import time
from typing import TextIO

PERIOD = 10.0   # seconds between plain lines when not on a terminal


def _terminal() -> TextIO | None:
    if sys.stdout.isatty():
        return sys.stdout
    if os.environ.get("GGML_PY_PROGRESS_TTY") == "1":
        try:
            return open("/dev/tty", "w")   # noqa: SIM115 (kept for the process' life)
        except OSError:
            return None
    return None


class Progress:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self._tty = _terminal()
        self._last_plain = 0.0
        self._open = False      # an in-place line is on the terminal

    def phase(self, text: str) -> None:
        """A phase starts (or ends): one line, everywhere."""
        self._clear()
        print(text, flush=True)
        if self._tty is not None and self._tty is not sys.stdout:
            print(text, file=self._tty, flush=True)

    def update(self, text: str, final: bool = False) -> None:
        """Where a phase stands, e.g. ``[12/37] ggml.c.o``: in place on a terminal, a plain
        line every PERIOD seconds (and the final one) otherwise."""
        if self._tty is not None:
            print(f"\r\033[K{text[:100]}", end="", file=self._tty, flush=True)
            self._open = True
        if self._tty is not sys.stdout:
            now = time.monotonic()
            if final or now - self._last_plain >= PERIOD:
                print(text, flush=True)
                self._last_plain = now

    def _clear(self) -> None:
        if self._open and self._tty is not None:
            print("\r\033[K", end="", file=self._tty, flush=True)
            self._open = False

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
