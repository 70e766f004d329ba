"""ggml's own optimizer (ggml_py.opt): training lowers the loss on data made here, parameters
are updated in place, and every bad input raises instead of reaching ggml's assertions."""
import gc
import weakref

import numpy as np
import pytest

import ggml_py as gg
from support import RELEASE
from ggml_py import opt


def blobs(rng, n_per_class=64, classes=3):
    centers = np.array([[0, 2], [2, -1], [-2, -1]], np.float32)[:classes]
    X = np.concatenate([c + rng.normal(0, 0.6, (n_per_class, 2)) for c in centers])
    X = X.astype(np.float32)
    y = np.repeat(np.arange(classes), n_per_class)
    order = rng.permutation(len(y))
    return X[order], y[order]


class Model:
    def __init__(self, backend, rng, batch=16, hidden=16, classes=3):
        self.ctx = gg.Context()
        self.x = self.ctx.tensor(gg.f32, (batch, 2), "x")
        self.W1 = self.ctx.tensor(gg.f32, (hidden, 2), "W1")
        self.b1 = self.ctx.tensor(gg.f32, (hidden,), "b1")
        self.W2 = self.ctx.tensor(gg.f32, (classes, hidden), "W2")
        self.ctx.alloc(backend)
        self.W1.set((rng.standard_normal((hidden, 2)) * 0.7).astype(np.float32))
        self.b1.set(np.zeros(hidden, np.float32))
        self.W2.set((rng.standard_normal((classes, hidden)) * 0.3).astype(np.float32))
        self.logits = gg.mul_mat(self.W2, gg.relu(gg.mul_mat(self.W1, self.x) + self.b1))
        self.params = [self.W1, self.b1, self.W2]


@pytest.fixture
def cpu_backend():
    with gg.device("CPU").backend(n_threads=1) as be:
        yield be


def test_training_lowers_the_loss_and_updates_parameters(cpu_backend, rng):
    X, y = blobs(rng)
    data = opt.Dataset(X, np.eye(3, dtype=np.float32)[y])
    m = Model(cpu_backend, rng)
    before = m.W1.numpy().copy()
    trainer = opt.Optimizer(cpu_backend, m.x, m.logits, m.params, lr=0.02)
    first = trainer.evaluate(data)
    for _ in range(15):
        train, val = trainer.epoch(data, val_split=0.25)
    assert train.ndata == 144 and val.ndata == 48
    last = trainer.evaluate(data)
    assert last.loss < first.loss / 3 and last.accuracy > 0.9
    assert not np.allclose(m.W1.numpy(), before)          # ggml stepped the parameters in place
    # the trained parameters give the same predictions through numpy
    h = np.maximum(X @ m.W1.numpy().T + m.b1.numpy(), 0)
    assert abs(np.mean((h @ m.W2.numpy().T).argmax(1) == y) - last.accuracy) < 0.01
    trainer.close()
    data.close()
    m.ctx.close()


def test_sgd_and_mse(cpu_backend, rng):
    X, y = blobs(rng)
    data = opt.Dataset(X, np.eye(3, dtype=np.float32)[y])
    m = Model(cpu_backend, rng)
    trainer = opt.Optimizer(cpu_backend, m.x, m.logits, m.params, loss="mse", optimizer="sgd",
                            lr=0.05)
    first = trainer.evaluate(data).loss
    for _ in range(10):
        trainer.epoch(data)
    assert trainer.evaluate(data).loss < first
    assert np.isnan(trainer.evaluate(data).accuracy)      # no predictions to count for MSE
    trainer.lr = 0.01
    assert trainer.lr == pytest.approx(0.01)
    trainer.close()


def test_bad_input_raises(cpu_backend, rng):
    X, y = blobs(rng)
    onehot = np.eye(3, dtype=np.float32)[y]
    with pytest.raises(gg.InvalidArgument, match="2-D array"):
        opt.Dataset(X.ravel(), onehot)
    with pytest.raises(gg.InvalidArgument, match="labels"):
        opt.Dataset(X, onehot[:-1])
    with pytest.raises(gg.InvalidArgument, match="shard"):
        opt.Dataset(X, onehot, shard=5)
    m = Model(cpu_backend, rng)
    with pytest.raises(gg.InvalidArgument, match="loss must be"):
        opt.Optimizer(cpu_backend, m.x, m.logits, m.params, loss="hinge")
    with pytest.raises(gg.InvalidArgument, match="lr must be"):
        opt.Optimizer(cpu_backend, m.x, m.logits, m.params, lr=0)
    with pytest.raises(gg.InvalidArgument, match="params"):
        opt.Optimizer(cpu_backend, m.x, m.logits, [])
    unallocated = gg.Context()
    free_x = unallocated.tensor(gg.f32, (16, 2))
    with pytest.raises(gg.InvalidArgument, match="inputs need memory"):
        opt.Optimizer(cpu_backend, free_x, m.logits, m.params)
    allocated = unallocated.tensor(gg.f32, (16, 3))
    unallocated.alloc(cpu_backend)
    with pytest.raises(gg.InvalidArgument, match="already have memory"):
        opt.Optimizer(cpu_backend, m.x, allocated, m.params)
    trainer = opt.Optimizer(cpu_backend, m.x, m.logits, m.params)
    with pytest.raises(gg.InvalidArgument, match="whole number of batches"):
        trainer.epoch(opt.Dataset(X[:100], onehot[:100]))
    with pytest.raises(gg.InvalidArgument, match="features"):
        trainer.epoch(opt.Dataset(np.c_[X, X], onehot))
    with pytest.raises(gg.InvalidArgument, match="labels per point"):
        trainer.epoch(opt.Dataset(X, onehot[:, :2]))
    with pytest.raises(gg.InvalidArgument, match="val_split"):
        trainer.epoch(opt.Dataset(X, onehot), val_split=1.0)
    with pytest.raises(gg.InvalidArgument, match="beta1"):
        trainer.set_hyperparameters(beta1=2)
    with pytest.raises(gg.InvalidArgument, match="not part of the outputs"):
        opt.Optimizer(cpu_backend, m.x, m.logits, [allocated])
    with pytest.raises(gg.InvalidArgument, match="no backward pass for op TANH"):
        opt.Optimizer(cpu_backend, m.x, gg.tanh(m.logits), m.params)
    summed = opt.Optimizer(cpu_backend, m.x, m.logits, m.params, loss="sum")
    with pytest.raises(gg.InvalidArgument, match="uses no labels"):
        summed.epoch(opt.Dataset(X, onehot))
    summed.epoch(opt.Dataset(X))                    # data points alone: fine
    summed.close()
    m.ctx.close()                                 # the model's context closes the trainer first
    assert trainer.closed
    with pytest.raises(gg.ClosedError):
        trainer.evaluate(opt.Dataset(X, onehot))
    unallocated.close()


def test_lifetime(cpu_backend, rng):
    X, y = blobs(rng)
    data = opt.Dataset(X, np.eye(3, dtype=np.float32)[y])
    m = Model(cpu_backend, rng)
    trainer = opt.Optimizer(cpu_backend, m.x, m.logits, m.params)
    trainer.epoch(data)
    refs = [weakref.ref(trainer), weakref.ref(data)]
    del trainer, data
    gc.collect()
    assert all(r() is None for r in refs)
    m.ctx.close()


def test_gradients_match_numpy(cpu_backend, rng):
    X = rng.standard_normal((5, 3)).astype(np.float32)
    Wv = rng.standard_normal((4, 3)).astype(np.float32)
    bv = rng.standard_normal(4).astype(np.float32)
    with gg.Context() as ctx:
        x, W, b = ctx.from_numpy(X, "x"), ctx.from_numpy(Wv, "W"), ctx.from_numpy(bv, "b")
        ctx.alloc(cpu_backend)
        x.set(X)
        W.set(Wv)
        b.set(bv)
        h = gg.mul_mat(W, x) + b
        loss = gg.sum(gg.relu(h) * gg.relu(h))
        dW, db = opt.gradients(loss, [W, b], cpu_backend)
        H = X @ Wv.T + bv
        G = 2 * np.maximum(H, 0) * (H > 0)
        np.testing.assert_allclose(dW, G.T @ X, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(db, G.sum(0), rtol=1e-5, atol=1e-5)
        # the forward graph is left as it was: no memory, no marks; it still computes
        assert loss.data is None and h.data is None
        cpu_backend.compute(gg.Graph(loss))
        assert loss.numpy()[0] == pytest.approx(float(np.sum(np.maximum(H, 0) ** 2)), rel=1e-5)


def test_gradients_refuse_what_ggml_cannot_differentiate(cpu_backend):
    with gg.Context() as ctx:
        W = ctx.tensor(gg.f32, (4, 3), "W")
        other = ctx.tensor(gg.f32, (4, 3), "other")
        ctx.alloc(cpu_backend)
        with pytest.raises(gg.InvalidArgument, match="no backward pass for op TANH"):
            opt.gradients(gg.sum(gg.tanh(W)), [W], cpu_backend)
        with pytest.raises(gg.InvalidArgument, match="scalar"):
            opt.gradients(W * 2, [W], cpu_backend)
        with pytest.raises(gg.InvalidArgument, match="not part of the loss"):
            opt.gradients(gg.sum(W * W), [other], cpu_backend)


def test_training_on_an_rpc_device(rpc_devs, rng):
    """Parameters and the optimizer's own tensors on a real RPC server, CPU as the fallback."""
    X, y = blobs(rng)
    data = opt.Dataset(X, np.eye(3, dtype=np.float32)[y])
    with rpc_devs[0].backend() as remote, gg.device("CPU").backend(n_threads=1) as cpu:
        m = Model(remote, rng)
        if RELEASE < (0, 20, 2):   # refused, cleanly (ggml-opt's memset would abort)
            with pytest.raises(gg.UnsupportedError, match=r"0\.20\.2 or newer"):
                opt.Optimizer([remote, cpu], m.x, m.logits, m.params, lr=0.02)
            pytest.skip(f"RPC buffers' memset, which training needs, arrived in ggml 0.20.2 "
                        f"(this build is {gg.ggml_version()}, which refuses it)")
        trainer = opt.Optimizer([remote, cpu], m.x, m.logits, m.params, lr=0.02)
        first = trainer.evaluate(data).loss
        for _ in range(10):
            trainer.epoch(data)
        last = trainer.evaluate(data)
        assert last.loss < first / 2 and last.accuracy > 0.9
        assert not m.W1.is_host                    # the parameters stayed on the server
        trainer.close()
        m.ctx.close()


def test_evaluate_reports_what_numpy_computes(cpu_backend, rng):
    """The loss, its uncertainty, the accuracy and the count of an evaluation, each against
    numpy on the same parameters (a swap of the loss and its uncertainty, or of accuracy and
    its uncertainty, in the result's reading fails here)."""
    X, y = blobs(rng)
    labels = np.eye(3, dtype=np.float32)[y]
    data = opt.Dataset(X, labels)
    m = Model(cpu_backend, rng)
    trainer = opt.Optimizer(cpu_backend, m.x, m.logits, m.params, lr=0.02)
    r = trainer.evaluate(data)
    # evaluation runs the data in order, 16 per batch: ggml's loss is the mean of the batches'
    # mean cross entropy, its uncertainty the standard error of that mean
    h = np.maximum(X @ m.W1.numpy().T + m.b1.numpy(), 0)
    logits = (h @ m.W2.numpy().T).astype(np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    per_batch = (-(labels * logp).sum(1)).reshape(-1, 16).mean(1)
    assert r.ndata == len(y)
    assert r.loss == pytest.approx(per_batch.mean(), rel=1e-4)
    assert r.loss_unc == pytest.approx(per_batch.std(ddof=1) / np.sqrt(len(per_batch)), rel=1e-3)
    hits = logits.argmax(1) == y
    assert r.accuracy == pytest.approx(hits.mean(), abs=1e-9)
    assert r.accuracy_unc == pytest.approx(np.sqrt(hits.mean() * (1 - hits.mean())
                                                   / (len(y) - 1)), rel=1e-3)
    trainer.close()
    data.close()
    m.ctx.close()
