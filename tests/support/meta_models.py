"""Small models for the tensor-parallel tests, notebook 07 and benchmarks/bench_meta.py: the
same graph built on a meta device and on one device (numpy-order shapes throughout)."""
import numpy as np

import ggml_py as gg

def meta_supported() -> bool:
    """Whether this build offers gg.meta_device (ggml 0.26.0 on)."""
    from ggml_py import _meta
    try:
        _meta.require_meta()
    except gg.UnsupportedError:
        return False
    return True


# how each weight is split for column-then-row parallelism (Megatron style): the first
# matmul's weight by output rows (numpy axis 0) with its bias, the second's by its inner axis
# (numpy axis 1), whose partial sums the meta backend all-reduces; inputs stay mirrored
MLP_SPLIT = {"w1": gg.Split(axis=0), "b1": gg.Split(axis=0), "w2": gg.Split(axis=1)}
ATTN_SPLIT = {"wq": gg.Split(axis=0), "wk": gg.Split(axis=0), "wv": gg.Split(axis=0),
              "wo": gg.Split(axis=1)}


def mlp_weights(rng, d=64, hidden=128, t=8, dtype=np.float32):
    return {"x": rng.standard_normal((t, d)).astype(np.float32),
            "w1": (rng.standard_normal((hidden, d)) / np.sqrt(d)).astype(dtype),
            "b1": rng.standard_normal(hidden).astype(np.float32),
            "w2": (rng.standard_normal((d, hidden)) / np.sqrt(hidden)).astype(dtype),
            "b2": rng.standard_normal(d).astype(np.float32)}


def mlp_numpy(w):
    h = np.maximum(w["x"] @ w["w1"].astype(np.float32).T + w["b1"], 0)
    return h @ w["w2"].astype(np.float32).T + w["b2"]


def mlp(t):
    """relu(x W1^T + b1) W2^T + b2, `t` a dict of tensors."""
    h = gg.relu(gg.add(gg.mul_mat(t["w1"], t["x"]), t["b1"]))
    return gg.add(gg.mul_mat(t["w2"], h), t["b2"])


def attn_weights(rng, d=64, t=8):
    w = {"x": rng.standard_normal((t, d)).astype(np.float32)}
    for k in ("wq", "wk", "wv", "wo"):
        w[k] = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    return w


def attn_numpy(w, heads):
    x = w["x"]
    t, d = x.shape
    dh = d // heads
    q, k, v = ((x @ w[n].T).reshape(t, heads, dh).transpose(1, 0, 2) for n in ("wq", "wk", "wv"))
    s = q @ k.transpose(0, 2, 1) / np.sqrt(dh)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    o = (s @ v).transpose(1, 0, 2).reshape(t, d)
    return o @ w["wo"].T


def attn(t, heads):
    """One self-attention block without mask: heads split over the devices (Q, K, V by
    output rows, the output projection by its inner axis), reduced at the end."""
    x = t["x"]
    tt, d = x.shape
    dh = d // heads

    def proj(name):
        return gg.permute(gg.reshape(gg.mul_mat(t[name], x), (tt, heads, dh)), (1, 0, 2))

    q, k = proj("wq"), proj("wk")
    v = gg.cont(gg.permute(gg.reshape(gg.mul_mat(t["wv"], x), (tt, heads, dh)), (1, 2, 0)))
    s = gg.soft_max(gg.mul_mat(k, q), scale=float(1 / np.sqrt(dh)))
    o = gg.mul_mat(v, s)                                   # (heads, t, dh)
    o = gg.reshape(gg.cont(gg.permute(o, (1, 0, 2))), (tt, d))
    return gg.meta_reduce(gg.mul_mat(t["wo"], o))


def run(dev_or_backend, weights, build, *, meta=None):
    """Build `build` over `weights` on a backend and return the output's values."""
    be = dev_or_backend
    with gg.Context() as ctx:
        ts = {k: ctx.from_numpy(v, k) for k, v in weights.items()}
        ctx.alloc(be)
        for k, v in weights.items():
            ts[k].set(v)
        y = build(ts)
        be.compute(gg.Graph(y))
        return y.numpy(copy=True)
