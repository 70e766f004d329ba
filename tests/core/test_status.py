"""ggml statuses and NULL results become the right exception (issue 28): ggml's own words
(``ggml_status_to_string``), OutOfMemory for an allocation failure, of a compute included."""
import numpy as np
import pytest

import ggml_py as gg
from ggml_py._loader import ffi, lib
from ggml_py.errors import check_ptr, check_status

# more than any machine can give: ggml_aligned_malloc fails at once (no page is touched)
HUGE = (1 << 16, 1 << 16, 1 << 12)         # 2**44 f32 = 64 TiB


def _words(status):
    return ffi.string(lib.ggml_status_to_string(status)).decode()


@pytest.mark.parametrize("name, exc", [("GGML_STATUS_ALLOC_FAILED", gg.OutOfMemory),
                                       ("GGML_STATUS_FAILED", gg.GGMLError),
                                       ("GGML_STATUS_ABORTED", gg.GGMLError)])
def test_status_maps_to_its_exception_in_ggmls_words(name, exc):
    status = int(getattr(lib, name))
    with pytest.raises(exc) as info:
        check_status(status, "compute")
    assert _words(status) in str(info.value)
    # only an allocation failure is a MemoryError
    assert isinstance(info.value, MemoryError) == (name == "GGML_STATUS_ALLOC_FAILED")


def test_success_and_pointers_pass_through():
    assert check_status(int(lib.GGML_STATUS_SUCCESS), "compute") is None
    p = ffi.new("int *")
    assert check_ptr(p, "x") is p
    with pytest.raises(gg.OutOfMemory, match="ggml returned NULL"):
        check_ptr(ffi.NULL, "alloc", gg.OutOfMemory)


def _huge_graph(be):
    ctx = gg.Context()
    a = ctx.tensor(gg.f32, (4,))
    ctx.alloc(be)
    a.set(np.ones(4, np.float32))
    return ctx, gg.Graph(gg.repeat(a, HUGE))


def test_compute_that_cannot_allocate_raises_out_of_memory(cpu):
    be = cpu.backend()
    ctx, g = _huge_graph(be)
    with pytest.raises(gg.OutOfMemory):
        be.compute(g)
    ctx.close()
    be.close()


def test_scheduled_compute_that_cannot_allocate_raises_out_of_memory(cpu):
    be = cpu.backend()
    ctx, g = _huge_graph(be)
    with gg.Scheduler([be]) as sched, pytest.raises(gg.OutOfMemory):
        sched.compute(g)
    ctx.close()
    be.close()
