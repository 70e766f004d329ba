"""What ggml-opt and ggml's backward pass assert on, refused before they see it.

ggml_opt_init, ggml_opt_epoch and ggml_compute_backward check their arguments with
``GGML_ASSERT``, which aborts the process: :class:`~ggml_py.opt.Optimizer` and
:func:`~ggml_py.opt.gradients` run these first. Also the tables of what a release offers
(losses, optimizers) and of the ops ggml can differentiate.
"""
from __future__ import annotations

from typing import Any

from ._backend import Backend
from ._rpc_liveness import buffer_device, endpoint_of, ensure_alive
from ._loader import ffi, lib
from ._tensor import Tensor
from .errors import InvalidArgument, UnsupportedError, require
from .ops._common import RELEASE

# (releases before ggml-opt.h, or before SGD, lack some of these: what is missing is refused)
LOSSES = {k: getattr(lib, f"GGML_OPT_LOSS_TYPE_{v}") for k, v in
          (("mean", "MEAN"), ("sum", "SUM"), ("cross_entropy", "CROSS_ENTROPY"),
           ("mse", "MEAN_SQUARED_ERROR")) if hasattr(lib, f"GGML_OPT_LOSS_TYPE_{v}")}
OPTIMIZERS = {k: getattr(lib, f"GGML_OPT_OPTIMIZER_TYPE_{v}") for k, v in
              (("adamw", "ADAMW"), ("sgd", "SGD")) if hasattr(lib, f"GGML_OPT_OPTIMIZER_TYPE_{v}")}
GRAPH_SIZE = int(lib.GGML_DEFAULT_GRAPH_SIZE)   # ggml-opt's graphs have this many slots

# ops whose gradient ggml's backward pass computes (ggml_compute_backward, 0.25.3); any other
# op there aborts the process
BACKWARD_OPS = frozenset(
    "NONE DUP ADD ADD1 SUB MUL DIV SQR SQRT LOG SIN COS SUM SUM_ROWS MEAN REPEAT RMS_NORM "
    "MUL_MAT SCALE CPY CONT RESHAPE VIEW PERMUTE TRANSPOSE GET_ROWS SOFT_MAX "
    "CROSS_ENTROPY_LOSS ABS SGN NEG STEP RELU SILU EXP".split())


def settings(backends: list[Any], loss: str, optimizer: str, opt_period: Any) -> None:
    """The Optimizer's choices: no meta device, a loss and an optimizer this release has, a
    whole number of batches per step, no RPC device before ggml 0.20.2."""
    require(all(not isinstance(b, Backend) or b.device.type != "meta" for b in backends),
            "a meta device computes no backward graphs (ggml asserts cgraph->grads == "
            "NULL)", UnsupportedError)
    require(loss in LOSSES, f"loss must be one of {sorted(LOSSES)}, not {loss!r}")
    require(optimizer in OPTIMIZERS,
            f"optimizer must be one of {sorted(OPTIMIZERS)} (this release), not {optimizer!r}")
    require(isinstance(opt_period, int) and opt_period >= 1, "opt_period must be an int >= 1")
    if RELEASE < (0, 20, 2):
        # ggml-opt clears its gradient and moment tensors with ggml_backend_tensor_memset,
        # which asserts on an RPC buffer before 0.20.2 (ggml-rpc had no memset_tensor)
        rpc = [b.name for b in backends if endpoint_of(b.device.ptr)]
        require(not rpc, f"training on an RPC device ({rpc[0] if rpc else ''}) needs ggml "
                         f"0.20.2 or newer (RPC buffers' memset); this build is "
                         f"{'.'.join(map(str, RELEASE))}", UnsupportedError)


def tensors(inputs: Any, outputs: Any, params: list[Any], loss: str) -> None:
    """The Optimizer's tensors: inputs with memory (batch, features), outputs without memory
    (batch, n: the optimizer places them), f32 parameters with memory."""
    require(isinstance(inputs, Tensor) and isinstance(outputs, Tensor),
            "inputs and outputs must be Tensors")
    require(bool(params) and all(isinstance(p, Tensor) for p in params),
            "params must be a non-empty list of Tensors")
    require(inputs.data is not None,
            "the inputs need memory before training (allocate their context first)")
    require(inputs.ndim == 2 and outputs.ndim <= 2,
            f"inputs must be (batch, features) and outputs (batch, n); got {inputs.shape} "
            f"and {outputs.shape}")
    require(outputs.ne[1] == inputs.ne[1],
            f"outputs {outputs.shape} must have one row per input row ({inputs.shape[0]})")
    require(outputs.data is None,
            "the outputs already have memory: build the model's ops after allocating the "
            "inputs and parameters, so that the optimizer places them")
    for p in params:
        require(p.type.name == "f32", f"parameter {p.name or '(unnamed)'} is {p.type.name}; "
                                      "only f32 parameters can be trained")
        require(p.data is not None, f"parameter {p.name or '(unnamed)'} has no memory")
    if loss == "cross_entropy":
        require(outputs.type.name == "f32", "cross entropy needs f32 outputs (logits)")


def model(backends: list[Backend], inputs: Tensor, params: list[Tensor],
          graph: list[Tensor]) -> None:
    """What ggml-opt asserts on (or its scheduler aborts on) once training starts, refused
    when the Optimizer is made: the inputs are where ggml_opt_epoch copies each batch (f32,
    as a Dataset holds, a tensor of their own: not a view or an op result, which
    ggml_set_input and the static graphs' copy assert on), the parameters are leaves
    (ggml_set_param asserts), and every tensor of the model that has memory sits in a buffer
    some backend of the optimizer can use (the scheduler aborts on "a buffer that cannot run
    the operation"), on a live server."""
    require(inputs.type.name == "f32",
            f"Optimizer: the inputs are {inputs.type.name}; ggml's optimizer copies f32 batches "
            "from the Dataset into them, so they must be f32")
    require(inputs.op == "NONE" and inputs.ptr.view_src == ffi.NULL,
            f"Optimizer: the inputs must be a tensor of their own (allocated, not a view or an "
            f"op result; got op {inputs.op}{', a view' if inputs.ptr.view_src != ffi.NULL else ''})")
    for p in params:
        require(p.op == "NONE" and p.ptr.view_src == ffi.NULL,
                f"Optimizer: parameter {p.name or '(unnamed)'} must be a tensor of its own "
                f"(not a view or an op result: ggml trains leaves only; got op {p.op})")
    for t in graph:
        if t.data is None:
            continue
        buf = t.ptr.buffer
        if buf == ffi.NULL:         # (a view ggml has not given its source's buffer yet:
            continue                # its source is judged)
        ensure_alive(buffer_device(buf))
        buft = lib.ggml_backend_buffer_get_type(buf)
        if not any(lib.ggml_backend_supports_buft(b.ptr, buft) for b in backends):
            where = ffi.string(lib.ggml_backend_buft_name(buft)).decode(errors="replace")
            raise InvalidArgument(
                f"Optimizer: tensor {t.name or '(unnamed)'} is in a {where} buffer, which none "
                f"of the backends {[b.name for b in backends]} can use: give the optimizer a "
                "backend of that device (or allocate the model on one of these)")


def backward_checked(out: Tensor, params: list[Tensor], what: str) -> list[Tensor]:
    """The tensors of `out`'s graph, after checking that ggml can differentiate it with
    respect to `params` (ggml_compute_backward aborts on any op it has no rule for)."""
    found, stack, seen = [], [out], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        found.append(t)
        stack.extend(t.src)
    for t in found:
        require(t.op in BACKWARD_OPS, f"ggml has no backward pass for op {t.op} "
                                      f"(tensor {t.name or '(unnamed)'})")
        if t.op == "MUL_MAT":
            a, b = t.src
            require(a.ne[2:] == b.ne[2:], "ggml's backward pass of a broadcast mul_mat is "
                                          "not implemented")
    require(all(p in seen for p in params), f"a parameter is not part of {what}'s graph")
    return found


__all__ = ["BACKWARD_OPS", "GRAPH_SIZE", "LOSSES", "OPTIMIZERS", "backward_checked", "model",
           "settings", "tensors"]
