"""What the loaded ggml release offers, read once from its bindings and consulted everywhere.

The bindings are generated per release, so a function or constant the release lacks is simply
absent from ``lib``. Code that depends on one asks this table (``_features.GGUF_FROM_BUFFER``)
rather than probing ``lib`` itself: one place says what each release offers, and a new
release's difference is one line here. Per-op or per-name lookups (``getattr(lib,
f"ggml_{name}")``) stay where they are: they are dispatch, not feature gates.
"""

from __future__ import annotations

import functools

from ._loader import backend_fn, lib


def _has(name: str) -> bool:
    return hasattr(lib, name)


#: ``ggml_version()``: the library names its own release
VERSION_STRING = _has("ggml_version")
#: ``ggml_commit()``: the library names the commit it was built from
COMMIT_STRING = _has("ggml_commit")
#: ``gguf_init_from_buffer``: a GGUF header parsed from memory (otherwise only from a file)
GGUF_FROM_BUFFER = _has("gguf_init_from_buffer")
#: ``gguf_get_tensor_ne``: a GGUF tensor's shape as ggml read it
GGUF_TENSOR_NE = _has("gguf_get_tensor_ne")
#: ``ggml_log_get``: the current log callback can be read back (otherwise setting NULL
#: restores ggml's default logger)
LOG_GET = _has("ggml_log_get")
#: ``ggml_reset``: a context can be emptied and reused
CONTEXT_RESET = _has("ggml_reset")
#: ``GGML_OP_TOP_K``: top_k is its own op with a contiguous result (otherwise a strided view
#: of a full argsort)
TOP_K_OP = _has("GGML_OP_TOP_K")
#: ``ggml_opt_init``: ggml-opt, the training loop
OPT = _has("ggml_opt_init")
#: ``ggml_backend_meta_device``: a device made of other devices' slices (tensor parallelism);
#: ggml_py offers it from the release its checks were written against (``_meta.CHECKED_FROM``)
META_DEVICE = _has("ggml_backend_meta_device")


@functools.lru_cache(maxsize=1)
def old_rpc_api() -> bool:
    """Whether this build's RPC backend has the first API form: one device per endpoint
    (``ggml_backend_rpc_add_device``, named "RPC[host:port]"), a server of one backend
    (``ggml_backend_rpc_start_server(backend, ...)``) and an empty HELLO; the later form has
    server registries (``ggml_backend_rpc_add_server``) with several devices per server.
    A function, not a constant: with ``GGML_BACKEND_DL`` the answer comes from the loaded
    backend modules' registries."""
    return (backend_fn("ggml_backend_rpc_add_server", "void *") is None
            and backend_fn("ggml_backend_rpc_add_device", "void *") is not None)


__all__ = ["VERSION_STRING", "COMMIT_STRING", "GGUF_FROM_BUFFER", "GGUF_TENSOR_NE", "LOG_GET",
           "CONTEXT_RESET", "TOP_K_OP", "OPT", "META_DEVICE", "old_rpc_api"]
