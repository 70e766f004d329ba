"""An event never recorded is not handed to ggml's synchronize (issue 33): there is nothing to
wait for, and Metal aborts the process when a synchronize is not signalled within 60 s. (With
the refusal removed, 0.26.0's RPC event returns at once: the test then fails, not hangs.)"""
import pytest

import ggml_py as gg
from support import needs_release


@needs_release("0.23.0", "events on RPC devices")
def test_synchronize_of_a_never_recorded_event_is_refused(rpc_devs):
    d = rpc_devs[0]
    with d.backend() as be, d.event() as ev:
        assert not ev.recorded
        with pytest.raises(gg.GGMLError, match="never recorded"):
            ev.synchronize()
        ev.record(be)
        assert ev.recorded
        ev.synchronize()
