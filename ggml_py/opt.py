"""Training with ggml's own optimizer (``ggml-opt.h``): datasets, AdamW or SGD, epochs.

ggml builds the backward graph itself (``ggml_build_backward_expand``), accumulates the
gradients of the tensors marked as parameters, and updates them in place with an optimizer
step op. This module wraps that with the checks ggml leaves to ``GGML_ASSERT`` (which aborts
the process).

    >>> from ggml_py import opt                                   # doctest: +SKIP
    >>> data = opt.Dataset(X, onehot)                    # rows are data points
    >>> ctx = gg.Context(); x = ctx.tensor(gg.f32, (batch, 2)); W = ctx.tensor(gg.f32, (3, 2))
    >>> ctx.alloc(cpu_backend); W.set(w0)
    >>> logits = gg.mul_mat(W, x)                        # built after alloc: left to the optimizer
    >>> trainer = opt.Optimizer(cpu_backend, x, logits, params=[W], lr=0.05)
    >>> train, val = trainer.epoch(data, val_split=0.2); train.loss, val.accuracy

The inputs and parameters must have memory before the optimizer is made; the ops between
inputs and outputs must not (the optimizer's scheduler places them, with the gradients).
Parameters are updated in place: after training, ``W.numpy()`` holds the trained values and
any graph over them computes with them.

Rules, each in one place: :mod:`ggml_py._opt_check` refuses when the Optimizer is made what
ggml-opt asserts on later; :meth:`Optimizer._using` wraps every call into ggml-opt (one thread
at a time, servers alive); :func:`gradients` runs the checks of a compute (``Graph.prepare``);
:func:`_finite` keeps NaN and inf out of datasets and reports parameters that become so.
"""
from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Iterable, Iterator, NamedTuple

import numpy as np

from . import _features, _opt_check
from ._opt_check import BACKWARD_OPS, GRAPH_SIZE, LOSSES, OPTIMIZERS
from ._handle import Owned
from ._loader import ffi, lib
from .errors import (GGMLError, InvalidArgument, UnsupportedError, check_ptr,
                     check_status, require)

if TYPE_CHECKING:
    from ._backend import Backend
    from ._tensor import Tensor


def _require_opt() -> None:
    require(_features.OPT and bool(LOSSES),
            "this ggml release has no ggml-opt (training needs a newer build)", UnsupportedError)


class NonFiniteError(GGMLError, FloatingPointError):
    """Training made a parameter NaN or infinite (the loss ggml reports can stay finite)."""


def _finite(a: np.ndarray[Any, Any], what: str) -> None:
    """InvalidArgument when `a` holds NaN or inf: ggml-opt trains on them without a word."""
    bad = ~np.isfinite(a)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidArgument(f"{what}: value {a[where]} at {where} is not finite; ggml's "
                              "optimizer would turn the parameters into NaN")


class Result(NamedTuple):
    """What one pass over (part of) a dataset measured; accuracy is NaN without labels to
    compare (losses other than cross entropy)."""
    loss: float
    loss_unc: float
    accuracy: float
    accuracy_unc: float
    ndata: int


class Dataset(Owned):
    """Data points (rows of `data`) and their labels (rows of `labels`), kept by ggml in host
    memory (``ggml_opt_dataset``). `shard` rows move together when the dataset is shuffled."""

    _kind = "dataset"

    def __init__(self, data: Any, labels: Any = None, *, shard: int = 1) -> None:
        _require_opt()
        data = _rows(data, "data")
        if labels is not None:
            labels = _rows(labels, "labels")
            require(len(labels) == len(data),
                    f"{len(data)} data points but {len(labels)} labels")
        require(isinstance(shard, int) and shard >= 1 and len(data) % shard == 0,
                f"shard must be an int >= 1 that divides the {len(data)} data points, "
                f"got {shard!r}")
        raw = lib.ggml_opt_dataset_init(lib.GGML_TYPE_F32, lib.GGML_TYPE_F32, data.shape[1],
                                        0 if labels is None else labels.shape[1], len(data), shard)
        if raw == ffi.NULL:
            raise GGMLError("ggml_opt_dataset_init failed")
        super().__init__(raw, lib.ggml_opt_dataset_free)
        self.shard = shard
        self.n_features = data.shape[1]
        self.n_labels = 0 if labels is None else labels.shape[1]
        lib.ggml_backend_tensor_set(lib.ggml_opt_dataset_data(raw), ffi.from_buffer("void *", data),
                                    0, data.nbytes)
        if labels is not None:
            lib.ggml_backend_tensor_set(lib.ggml_opt_dataset_labels(raw),
                                        ffi.from_buffer("void *", labels), 0, labels.nbytes)

    @property
    def ndata(self) -> int:
        return int(lib.ggml_opt_dataset_ndata(self.ptr))

    def __len__(self) -> int:
        return self.ndata

    def __repr__(self) -> str:
        return "<Dataset closed>" if self.closed else \
            f"<Dataset {self.ndata} points x {self.n_features}, labels x {self.n_labels}>"


def _rows(data: Any, what: str) -> np.ndarray[Any, np.dtype[np.float32]]:
    a: np.ndarray[Any, np.dtype[np.float32]] = np.ascontiguousarray(data, dtype=np.float32)
    require(a.ndim == 2 and a.shape[0] > 0 and a.shape[1] > 0,
            f"{what} must be a non-empty 2-D array (one row per data point), got shape {a.shape}")
    _finite(a, f"Dataset: {what}")
    return a


class _ResultHandle(Owned):
    _kind = "optimization result"


class _ComputeMemory(Owned):
    _kind = "optimizer compute context"


class Optimizer(Owned):
    """``ggml_opt_context`` with static graphs: the forward graph from `inputs` to `outputs`,
    its backward graph and the optimizer step, computed by a scheduler over `backends` (a
    Backend or a list, the last a CPU; the first holds the optimizer's own tensors).

    `inputs` has shape (batch, features) and `outputs` (batch, n_labels); `params` are the
    tensors to train (float32, with memory). `loss` is one of ``LOSSES``, `optimizer`
    ``"adamw"`` or ``"sgd"``; the learning rate and the other hyperparameters can be changed
    between epochs (``trainer.lr = 1e-3``)."""

    _kind = "optimizer"

    def __init__(self, backends: Backend | Iterable[Backend], inputs: Tensor, outputs: Tensor,
                 params: Iterable[Tensor], *, loss: str = "cross_entropy",
                 optimizer: str = "adamw", lr: float = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                 opt_period: int = 1) -> None:
        from . import Backend, Scheduler   # the package face (late: it imports us)
        _require_opt()
        backends = [backends] if isinstance(backends, Backend) else list(backends)
        _opt_check.settings(backends, loss, optimizer, opt_period)
        params = list(params)
        _opt_check.tensors(inputs, outputs, params, loss)
        model = _opt_check.backward_checked(outputs, params, "the outputs")
        _opt_check.model(backends, inputs, params, model)
        n_nodes = len(model)
        require(4 * n_nodes + 64 < GRAPH_SIZE,
                f"the model has {n_nodes} tensors; ggml-opt's graphs hold {GRAPH_SIZE} slots, "
                "enough for about a quarter of that with gradients and optimizer steps")
        self._sched = Scheduler(backends)
        # ggml-opt puts three graphs (with gradient slots) and every backward tensor here
        overhead = int(lib.ggml_tensor_overhead())
        size = 3 * int(lib.ggml_graph_overhead_custom(GRAPH_SIZE, True)) + 8 * n_nodes * overhead \
            + 64 * overhead
        init: dict[str, Any] = {"mem_size": size, "mem_buffer": ffi.NULL, "no_alloc": True}
        raw_ctx = check_ptr(lib.ggml_init(init),
                            "ggml_init failed for the optimizer's compute context")
        self._compute = _ComputeMemory(raw_ctx, lib.ggml_free)
        self._pars = ffi.new("struct ggml_opt_optimizer_params *")
        self._optimizer = optimizer
        self.set_hyperparameters(lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                 weight_decay=weight_decay)
        for p in params:
            lib.ggml_set_param(p.ptr)
        opt_params = lib.ggml_opt_default_params(self._sched.ptr, LOSSES[loss])
        opt_params.ctx_compute = raw_ctx
        opt_params.inputs = inputs.ptr
        opt_params.outputs = outputs.ptr
        opt_params.opt_period = opt_period
        opt_params.get_opt_pars = lib.ggml_opt_get_constant_optimizer_params
        opt_params.get_opt_pars_ud = self._pars
        if hasattr(opt_params, "optimizer"):          # (releases before SGD have AdamW only)
            opt_params.optimizer = OPTIMIZERS[optimizer]
        raw = check_ptr(lib.ggml_opt_init(opt_params), "ggml_opt_init failed")
        # freed before the scheduler, the compute context and the tensors' contexts
        super().__init__(raw, lib.ggml_opt_free,
                         parents=(self._sched, self._compute, inputs.ctx, outputs.ctx)
                         + tuple(p.ctx for p in params))
        self.inputs, self.outputs, self.params, self.loss = inputs, outputs, params, loss
        self.batch = int(inputs.ne[1])
        self._results = [_ResultHandle(lib.ggml_opt_result_init(), lib.ggml_opt_result_free,
                                       parents=(self,)) for _ in range(2)]
        # close() frees ggml-opt's context, then the scheduler and compute memory made for it
        self.on_close(self._sched.close, after_free=True)
        self.on_close(self._compute.close, after_free=True)

    # -- hyperparameters -------------------------------------------------------------------
    def set_hyperparameters(self, *, lr: float | None = None, beta1: float | None = None,
                            beta2: float | None = None, eps: float | None = None,
                            weight_decay: float | None = None) -> None:
        """Change what the next optimizer steps use (checked here: ggml asserts on them)."""
        a = self._pars.adamw
        s = getattr(self._pars, "sgd", a)        # (releases before SGD: AdamW's only)
        if lr is not None:
            require(isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr),
                    f"lr must be a finite number > 0, got {lr!r}")
            a.alpha = s.alpha = float(lr)
        for name, v in (("beta1", beta1), ("beta2", beta2)):
            if v is not None:
                require(isinstance(v, (int, float)) and 0 <= v <= 1, f"{name} must be in [0, 1]")
                setattr(a, name, float(v))
        if eps is not None:
            require(isinstance(eps, (int, float)) and eps >= 0, "eps must be >= 0")
            a.eps = float(eps)
        if weight_decay is not None:
            require(isinstance(weight_decay, (int, float)) and 0 <= weight_decay <= 1,
                    "weight_decay must be in [0, 1]")
            a.wd = s.wd = float(weight_decay)

    @property
    def lr(self) -> float:
        return float(self._pars.adamw.alpha)

    @lr.setter
    def lr(self, value: float) -> None:
        self.set_hyperparameters(lr=value)

    # -- training --------------------------------------------------------------------------
    def epoch(self, dataset: Dataset, *, val_split: float = 0.0,
              shuffle: bool = True) -> tuple[Result, Result | None]:
        """One pass over `dataset`: optimizer steps on the first part (shuffled first when
        `shuffle`), evaluation only on the last `val_split` of it. Returns the training and
        the validation results (None without a validation part)."""
        split = self._split(dataset, val_split, train=True)
        with self._using("epoch", dataset):
            if shuffle and split:
                lib.ggml_opt_dataset_shuffle(self.ptr, dataset.ptr, split)
            train, val = self._run(dataset, split)
            self._check_params()
        assert train is not None      # split > 0: at least one batch trained
        return train, val

    def evaluate(self, dataset: Dataset) -> Result:
        """Loss and accuracy of the current parameters on all of `dataset` (no step)."""
        self._split(dataset, 0.0, train=False)
        with self._using("evaluate", dataset):
            result = self._run(dataset, 0)[1]
        assert result is not None     # every point is evaluated
        return result

    def reset(self, optimizer: bool = True) -> None:
        """Zero the accumulated gradients and, with `optimizer`, the AdamW moments."""
        with self._using("reset"):
            lib.ggml_opt_reset(self.ptr, bool(optimizer))

    @contextlib.contextmanager
    def _using(self, what: str, dataset: "Dataset | None" = None) -> Iterator[None]:
        """Hold the optimizer (and `dataset`) for one call into ggml-opt: ggml-opt's context
        takes one caller at a time (a second thread aborts it), so another thread raises
        here; close() waits for the call to end. Its backends and its tensors' servers must
        be alive (ggml's RPC client aborts on a dead one)."""
        if not self._lock.acquire(blocking=False):
            raise GGMLError(f"{what}: this optimizer is in use by another thread (one call at "
                            "a time per Optimizer)")
        try:
            self.ptr                  # refuse a closed optimizer
            with contextlib.ExitStack() as stack:
                if dataset is not None:
                    stack.enter_context(dataset.lock)   # not freed under the epoch
                    dataset.ptr
                self._sched.ensure_alive()
                for p in (self.inputs, *self.params):
                    p.require_memory(what)
                yield
        finally:
            self._lock.release()

    def _check_params(self) -> None:
        """NonFiniteError when a step made a parameter NaN or inf (ggml's reported loss can
        stay finite: it is computed before the step)."""
        for p in self.params:
            a = np.empty(p.shape, np.float32)
            p.ptr
            lib.ggml_backend_tensor_get(p.ptr, ffi.from_buffer("void *", a, require_writable=True),
                                        0, a.nbytes)
            if not np.isfinite(a).all():
                raise NonFiniteError(f"epoch: parameter {p.name or '(unnamed)'} is not finite "
                                     "after this epoch's steps (lower the learning rate, or "
                                     "check the data's scale); its values are kept as they are")

    def _split(self, dataset: Dataset, val_split: float, *, train: bool) -> int:
        require(isinstance(dataset, Dataset), "expected an opt.Dataset")
        dataset.ptr
        require(dataset.n_features == self.inputs.ne[0],
                f"the dataset has {dataset.n_features} features per point, the inputs "
                f"{self.inputs.ne[0]}")
        if self.loss in ("cross_entropy", "mse"):
            require(dataset.n_labels == self.outputs.ne[0],
                    f"the dataset has {dataset.n_labels} labels per point, the outputs "
                    f"{self.outputs.ne[0]}")
        else:                 # ggml asserts that labels come exactly when the loss uses them
            require(dataset.n_labels == 0,
                    f"loss {self.loss!r} uses no labels: make the Dataset without them")
        n = dataset.ndata
        require(n % self.batch == 0,
                f"the dataset's {n} points are not a whole number of batches of {self.batch}")
        require(isinstance(val_split, (int, float)) and 0 <= val_split < 1,
                f"val_split must be in [0, 1), got {val_split!r}")
        if not train:
            return 0
        unit = self.batch * dataset.shard // math.gcd(self.batch, dataset.shard)
        split = int(n * (1 - val_split)) // unit * unit
        require(split > 0, f"no whole batch of {self.batch} is left to train on")
        return split

    def _run(self, dataset: Dataset, split: int) -> tuple[Result | None, Result | None]:
        train, val = (r.ptr for r in self._results)
        lib.ggml_opt_result_reset(train)
        lib.ggml_opt_result_reset(val)
        lib.ggml_opt_epoch(self.ptr, dataset.ptr, train, val, split, ffi.NULL, ffi.NULL)
        n = dataset.ndata
        return (_result(train) if split else None), (_result(val) if split < n else None)

    def __repr__(self) -> str:
        if self.closed:
            return "<Optimizer closed>"
        return (f"<Optimizer {self._optimizer} lr={self.lr:g} loss={self.loss} batch={self.batch} "
                f"params={len(self.params)}>")


def gradients(loss: Tensor, params: Iterable[Tensor],
              backend: Backend) -> list[np.ndarray[Any, np.dtype[np.float32]]]:
    """d`loss`/d`param` for each of `params`, as ggml computes them: the forward graph of
    `loss` (a scalar f32 tensor), ``ggml_build_backward_expand``, one compute on `backend`.
    Tensors of the forward graph without memory get it for this computation only.

        >>> x, W = ...; loss = gg.sum(gg.mul_mat(W, x) * gg.mul_mat(W, x))   # doctest: +SKIP
        >>> (dW,) = opt.gradients(loss, [W], cpu_backend)    # 2 x^T x W^T, by ggml
    """
    from . import Backend, Graph, Tensor
    params = list(params)
    require(isinstance(loss, Tensor) and loss.size == 1 and loss.type.name == "f32",
            "loss must be a scalar f32 tensor (gg.sum(...), gg.mean(...))")
    require(isinstance(backend, Backend), "backend must be a Backend")
    require(backend.device.type != "meta", "a meta device computes no backward graphs (ggml "
            "asserts cgraph->grads == NULL)", UnsupportedError)
    require(bool(params) and all(isinstance(p, Tensor) for p in params),
            "params must be a non-empty list of Tensors")
    for p in params:
        require(p.type.name in ("f32", "f16") and p.data is not None,
                f"parameter {p.name or '(unnamed)'} must be f32 or f16 and have memory")
    tensors = _opt_check.backward_checked(loss, params, "the loss")
    # the checks of a compute, by the code that runs them for one (leaves need memory, every
    # buffer usable by the backend, every op supported, index inputs in range, servers alive)
    forward = Graph(loss)
    with backend.lock:
        backend.ensure_alive()
        forward.prepare(backend, place=False)
        forward.check_indices()
        return _gradients(loss, params, backend, tensors)


def _gradients(loss: Tensor, params: list[Tensor], backend: Backend,
               tensors: list[Tensor]) -> list[np.ndarray[Any, np.dtype[np.float32]]]:
    n = len(tensors)
    size = max(GRAPH_SIZE, 8 * n)
    overhead = int(lib.ggml_tensor_overhead())
    raw = lib.ggml_init({"mem_size": int(lib.ggml_graph_overhead_custom(size, True))
                         + (6 * n + 16) * overhead, "mem_buffer": ffi.NULL, "no_alloc": True})
    if raw == ffi.NULL:
        raise GGMLError("ggml_init failed for the backward graph")
    memory = _ComputeMemory(raw, lib.ggml_free)
    unallocated = [t.ptr for t in tensors if t.data is None]
    flags = [(t.ptr, int(t.ptr.flags)) for t in tensors]
    galloc = ffi.NULL
    try:
        for p in params:
            lib.ggml_set_param(p.ptr)       # before the graph is built: parameters are nodes
        lib.ggml_set_loss(loss.ptr)
        graph = lib.ggml_new_graph_custom(raw, size, True)
        lib.ggml_build_forward_expand(graph, loss.ptr)
        lib.ggml_build_backward_expand(raw, graph, ffi.NULL)
        galloc = lib.ggml_gallocr_new(lib.ggml_backend_get_default_buffer_type(backend.ptr))
        if galloc == ffi.NULL or not lib.ggml_gallocr_alloc_graph(galloc, graph):
            raise GGMLError(f"allocating the backward graph on {backend.name} failed")
        lib.ggml_graph_reset(graph)         # d loss / d loss = 1, other gradients 0
        check_status(lib.ggml_backend_graph_compute(backend.ptr, graph), "backward graph compute")
        out = []
        for p in params:
            g = lib.ggml_graph_get_grad(graph, p.ptr)
            a = np.zeros(p.shape, np.float32)
            if g != ffi.NULL:
                lib.ggml_backend_tensor_get(g, ffi.from_buffer("void *", a, require_writable=True),
                                            0, a.nbytes)
            out.append(a)
        return out
    finally:
        # the forward tensors go back as they were: no memory from this computation, no
        # parameter or loss marks (a later optimizer refuses extra losses)
        for t in unallocated:
            t.data = ffi.NULL
            t.buffer = ffi.NULL
        for t, f in flags:
            t.flags = f
        if galloc != ffi.NULL:
            lib.ggml_gallocr_free(galloc)
        memory.close()


def _result(raw: Any) -> Result:
    ndata = ffi.new("int64_t *")
    loss, loss_unc = ffi.new("double *"), ffi.new("double *")
    acc, acc_unc = ffi.new("double *"), ffi.new("double *")
    lib.ggml_opt_result_ndata(raw, ndata)
    lib.ggml_opt_result_loss(raw, loss, loss_unc)
    lib.ggml_opt_result_accuracy(raw, acc, acc_unc)
    return Result(float(loss[0]), float(loss_unc[0]), float(acc[0]), float(acc_unc[0]),
                  int(ndata[0]))


__all__ = ["Dataset", "Optimizer", "Result", "NonFiniteError", "gradients", "LOSSES", "OPTIMIZERS",
           "BACKWARD_OPS"]


def __dir__() -> list[str]:       # dir() and help() show the module's API only
    return sorted(__all__)
