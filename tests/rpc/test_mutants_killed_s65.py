"""Tests written against the survivors of the seed-65 mutation sample (docs/mutation.md,
round 7): each fails when its mutant (tools/must_kill.txt) is applied and passes without."""
import numpy as np
import pytest

import ggml_py as gg
from ggml_py import opt


def test_a_refused_name_leaves_no_tensor_behind():
    """Bad input loses nothing: a name ggml cannot hold is refused before the tensor is made,
    not after (the name setter would refuse it too, with the tensor already in the context)."""
    with gg.Context() as ctx:
        for bad in ("x" * 64, "a\0b"):
            with pytest.raises(gg.InvalidArgument, match="shorter than 64 bytes, without NUL"):
                ctx.tensor(gg.f32, (4,), name=bad)
        assert ctx.tensors == []


@pytest.mark.parametrize("shape", [(0,), (4, 0), (2, -3)])
def test_every_axis_is_at_least_one(shape):
    with gg.Context() as ctx:
        with pytest.raises(gg.InvalidArgument, match=r"every axis must be >= 1"):
            ctx.tensor(gg.f32, shape)
        assert ctx.tensors == []


def test_the_scheduler_takes_a_graph(cpu):
    with cpu.backend() as be:
        sched = gg.Scheduler([be])
        with gg.Context() as ctx:
            t = ctx.tensor(gg.f32, (4,))
            for call in (sched.alloc, sched.compute):
                for bad in (t, "graph", None):
                    with pytest.raises(gg.InvalidType, match="expected a gg.Graph, not"):
                        call(bad)


@pytest.mark.parametrize("name", ["q8_1", "q8_k"])
def test_reading_a_type_ggml_cannot_convert_to_float_is_refused(cpu, name):
    """q8_1 and q8_K are ggml's intermediate types of matmul: no to_float. Calling the NULL
    pointer would kill the process."""
    with cpu.backend() as be, gg.Context() as ctx:
        t = ctx.tensor(name, (256,))
        ctx.alloc(be)
        t.set(np.zeros(t.nbytes, np.uint8), flat=True)          # raw bytes
        with pytest.raises(gg.InvalidType, match=f"no conversion to float for {name}"):
            t.numpy()


def test_reset_restarts_the_optimizer(cpu, rng):
    """reset(): the same epoch from the same weights after a reset steps the weights exactly
    as the first time (AdamW's moments and step count zeroed); without it they differ."""
    X = rng.standard_normal((64, 2)).astype(np.float32)
    Y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 64)]
    with cpu.backend(n_threads=1) as be, gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (16, 2), "x")
        w = ctx.tensor(gg.f32, (3, 2), "w")
        ctx.alloc(be)
        w0 = rng.standard_normal((3, 2)).astype(np.float32)
        w.set(w0)
        trainer = opt.Optimizer(be, x, gg.mul_mat(w, x), [w], lr=0.05)
        data = opt.Dataset(X, Y)

        def epoch_from_w0(reset):
            w.set(w0)
            if reset:
                trainer.reset()
            trainer.epoch(data, shuffle=False)
            return w.numpy().copy()
        first = epoch_from_w0(False)
        assert not np.array_equal(first, w0)
        assert not np.array_equal(epoch_from_w0(False), first)    # the moments carried on
        np.testing.assert_array_equal(epoch_from_w0(True), first)
        trainer.close()


def test_a_shape_beyond_what_ggml_can_address_is_refused_where_it_is_read():
    """shape_of, the one reader of every shape argument, refuses more than 2**60 elements
    (ggml's byte counts are int64), for a new tensor and for an op's target shape alike."""
    huge = (2 ** 21,) * 3
    with gg.Context() as ctx:
        with pytest.raises(gg.OutOfMemory, match=r"has more elements than ggml can address"):
            ctx.tensor(gg.f32, huge)
        a = ctx.tensor(gg.f32, (1,))
        with pytest.raises(gg.OutOfMemory, match=r"has more elements than ggml can address"):
            gg.repeat(a, huge)
