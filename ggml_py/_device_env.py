"""Environment variables a backend's registry reads again after ggml made its devices.

A value changed between lookups makes that backend index devices it never created and abort;
the values at this process's first device lookup are kept here and every later lookup checks
them (:func:`check_env`).
"""
from __future__ import annotations

import os

from ._loader import BUILD
from .errors import UnsupportedError

#: environment variables that a backend's registry reads again on later calls, by backend:
#: Metal re-reads GGML_METAL_DEVICES with atoi on every ``ggml_backend_metal_reg()`` call, so
#: a value changed after ggml made its devices makes it index devices it never created and
#: abort. Their values at the first lookup are kept (:func:`check_env`).
REREAD_ENV = {"metal": "GGML_METAL_DEVICES"}
at_first_lookup: dict[str, str | None] = {}


def check_env() -> None:
    """Raise UnsupportedError when a variable of :data:`REREAD_ENV`, for a backend this build
    has, changed since this process's first device lookup (the first call records them)."""
    if not at_first_lookup:
        at_first_lookup.update({v: os.environ.get(v) for v in REREAD_ENV.values()})
        return
    for backend, var in REREAD_ENV.items():
        now, then = os.environ.get(var), at_first_lookup[var]
        if now != then and backend in BUILD["backends"]:
            raise UnsupportedError(
                f"{var} changed from {then!r} to {now!r} after ggml made its devices: ggml reads "
                f"it again on later calls and can abort. Set it before the first device lookup "
                f"(or in a new process), or restore it ({then if then is not None else 'unset'})")


def env_at_first_lookup(var: str) -> str | None:
    """The value `var` (one of :data:`REREAD_ENV`) had at the first device lookup."""
    check_env()
    return at_first_lookup[var]


__all__ = ["REREAD_ENV", "check_env", "env_at_first_lookup", "at_first_lookup"]
