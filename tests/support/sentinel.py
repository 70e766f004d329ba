"""Destinations that start different from what a transfer must put there (issue 28).

A transfer test whose destination already holds the expected bytes (``ctx.from_numpy(x)``
sets them at alloc) cannot fail: a copy that copies nothing passes it. ``unlike(x)`` is an
array of x's dtype and shape whose every byte differs from x's (the bitwise complement of its
bytes, so floats become other values or NaN patterns); a test starts its destination from it
and then asserts the expected bytes, which proves the bytes changed.
"""
import numpy as np


def unlike(x):
    """x's dtype and shape, every byte different (~x bytewise)."""
    x = np.ascontiguousarray(x)
    return (~x.view(np.uint8)).view(x.dtype).reshape(x.shape)


def assert_bytes(got, want, before=None):
    """`got` holds `want`'s bytes; with `before` (the destination's starting bytes), also
    that the transfer changed them (it cannot have, by chance, left them)."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if before is not None:
        assert np.ascontiguousarray(before).tobytes() != want.tobytes(), \
            "the destination started with the expected bytes: this test could not fail"
    assert got.tobytes() == want.tobytes()
