"""A pytest plugin that removes one part of event ordering or of a copy, to show that the
ordering tests can fail (issues 17 and 33). ``GGML_PY_MUTATE`` picks what is removed:

- ``record``: ``Event.record`` queues nothing in ggml (the wrapper still counts the event
  as recorded, so a synchronize reaches ggml and returns at once);
- ``wait``: ``Backend.wait`` does nothing;
- ``synchronize``: ``Event.synchronize`` does nothing (the host does not wait);
- ``copy``: ``copy_async`` does nothing (the destination keeps its sentinel).

The event-ordering tests must then FAIL on devices with real asynchronous queues (CUDA,
Vulkan, Metal); a pass means the test could not notice the missing part.

    GGML_PY_MUTATE=wait python -m pytest -p tools.mutate_events -k "ordered_by or events_order" tests/

The tests of tests/accel/test_metal.py that take `single` or `pair` run on Metal (macOS,
GGML_METAL_DEVICES=2) and on two CUDA devices of one GPU, with the same design:

    for m in "" record wait synchronize copy; do echo "== mutation: ${m:-none}"
      GGML_CUDA_DEVICES=2 GGML_PY_MUTATE=$m python -m pytest -p tools.mutate_events \\
        -p no:randomly -q -rfE tests/accel/test_metal.py 2>&1 | tail -8
    done

Expected: unmutated, the five tests of `single`/`pair` pass (the Metal-only ones skip);
record fails the single-device and two-device event tests; wait fails the
two-device event test; synchronize fails both event tests; copy fails both copy tests; the
scheduler test passes under all four (it uses none of them directly).

(The RPC backend of ggml 0.25.3 waits on nothing and copies blocking, so on CPU + RPC alone
these tests cannot tell; nor can Vulkan's backends, which share their device's queue: on
lavapipe, record and wait removed, every Vulkan0 event test passed (2026-12-06), so the
two-backend event test skips there. They are shown on the CUDA pair.)
"""
import os

import ggml_py as gg
from ggml_py import _event

MODES = ("record", "wait", "synchronize", "copy")


def _record_without_ggml(self, backend):
    self._recorded = True           # the wrapper's bookkeeping, and no signal queued in ggml


def pytest_configure(config):
    mode = os.environ.get("GGML_PY_MUTATE", "")
    if mode == "record":
        gg.Event.record = _record_without_ggml
    elif mode == "wait":
        gg.Backend.wait = lambda self, event: None
    elif mode == "synchronize":
        gg.Event.synchronize = lambda self: None
    elif mode == "copy":
        gg.copy_async = lambda src, dst, src_backend, dst_backend: None
    elif mode:
        raise ValueError(f"GGML_PY_MUTATE must be one of {', '.join(MODES)}, not {mode!r}")
    assert gg.Event is _event.Event
    if mode:
        config.issue_config_time_warning(
            UserWarning(f"ggml_py mutation active: {mode} removed; ordering tests should fail"),
            stacklevel=2)
