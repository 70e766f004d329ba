"""Tests written against the survivors of the census of every mutant (docs/mutation.md, round
8): each fails when its mutant (tools/must_kill.txt) is applied and passes without."""
import pytest

import ggml_py as gg


@pytest.mark.parametrize("bad", ["127.0.0.1 :50052", "h\u00e9te:50052", "a\x00b:50052",
                                 "a\tb:50052", "a\nb:50052"])
def test_an_endpoint_is_printable_ascii_without_spaces(bad):
    """ggml's RPC client and server take the endpoint as a C string: a NUL would cut it, a
    space or a non-ASCII host reaches the resolver. Refused before any socket, by name."""
    for fn in (gg.rpc.parse_endpoint, gg.rpc.connect):
        with pytest.raises(gg.InvalidArgument, match="must be printable ASCII without spaces"):
            fn(bad)
