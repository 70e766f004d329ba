"""A pytest plugin that removes one half of event ordering, to show the ordering tests can
fail (issue 17): with ``GGML_PY_MUTATE=record`` ``Event.record`` does nothing, with
``GGML_PY_MUTATE=wait`` ``Backend.wait`` does nothing. The event-ordering tests must then FAIL
on devices with real asynchronous queues (CUDA, Vulkan, Metal); a pass means the test could
not notice a missing record or wait.

    GGML_PY_MUTATE=wait python -m pytest -p tools.mutate_events -k "ordered_by or events_order" tests/

(The RPC backend of ggml 0.25.3 waits on nothing and copies blocking, so on CPU + RPC alone
these tests cannot tell; that is why they are shown on Vulkan0 and on the CUDA pair.)
"""
import os

import ggml_py as gg


def pytest_configure(config):
    mode = os.environ.get("GGML_PY_MUTATE", "")
    if mode == "record":
        gg.Event.record = lambda self, backend: None
    elif mode == "wait":
        gg.Backend.wait = lambda self, event: None
    elif mode:
        raise ValueError(f"GGML_PY_MUTATE must be 'record' or 'wait', not {mode!r}")
    if mode:
        config.issue_config_time_warning(
            UserWarning(f"ggml_py mutation active: {mode} removed; ordering tests should fail"),
            stacklevel=2)
