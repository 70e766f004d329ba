"""Every op with every kind of tensor type, on the CPU, an RPC device and CUDA devices where
the build has them: each call either
raises a GGMLError or computes. ggml's CPU backend reports most ops as supported for any type
and then aborts inside the kernel (and an RPC server dies of the same), so this is where
ggml_py's per-op type rules are proven. Runs in a child process, which names the case that
killed it, if one does."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import sys, numpy as np, ggml_py as gg
srv = gg.rpc.serve(); (rpc,) = gg.rpc.connect(srv.endpoint).devices
TYPES = ["f32", "f16", "bf16", "f64", "i32", "i16", "i8", "q8_0", "q4_0"]
OPS = {
    "add": lambda T, i: T((4, 32)) + T((4, 32)), "mul": lambda T, i: T((4, 32)) * T((4, 32)),
    "div": lambda T, i: gg.div(T((4, 32)), T((4, 32))), "scale": lambda T, i: gg.scale(T((4, 32)), 2.0),
    "relu": lambda T, i: gg.relu(T((4, 32))), "gelu": lambda T, i: gg.gelu(T((4, 32))),
    "exp": lambda T, i: gg.exp(T((4, 32))), "sqrt": lambda T, i: gg.sqrt(T((4, 32))),
    "neg": lambda T, i: -T((4, 32)), "sum": lambda T, i: gg.sum(T((4, 32))),
    "sum_rows": lambda T, i: gg.sum_rows(T((4, 32))), "mean": lambda T, i: gg.mean(T((4, 32))),
    "argmax": lambda T, i: gg.argmax(T((4, 32))), "cumsum": lambda T, i: gg.cumsum(T((4, 32))),
    "mul_mat": lambda T, i: gg.mul_mat(T((4, 32)), T((4, 32))),
    "mul_mat f32 b": lambda T, i: gg.mul_mat(T((4, 32)), T((4, 32), "f32")),
    "matmul": lambda T, i: T((4, 32)) @ T((32, 32)), "out_prod": lambda T, i: gg.out_prod(T((4, 32)), T((4, 32))),
    "transpose+cont": lambda T, i: gg.cont(T((4, 32)).T), "reshape": lambda T, i: gg.cont(T((4, 32)).reshape((32, 4))),
    "view": lambda T, i: gg.cont(T((4, 32)).view((2, 32))), "permute": lambda T, i: gg.cont(T((1, 4, 2, 32)).permute((0, 2, 1, 3))),
    "concat": lambda T, i: gg.concat(T((4, 32)), T((4, 32)), 0), "repeat": lambda T, i: gg.repeat(T((4, 32)), (8, 32)),
    "pad": lambda T, i: gg.pad(T((4, 32)), [1, 1]), "cpy to f32": lambda T, i: gg.cpy(T((4, 32)), T((4, 32), "f32")),
    "get_rows": lambda T, i: gg.get_rows(T((4, 32)), i), "set_rows": lambda T, i: gg.set_rows(T((4, 32)), T((4, 32)), i),
    "set_rows f32 rows": lambda T, i: gg.set_rows(T((4, 32)), T((4, 32), "f32"), i),
    "flash_attn f32 q": lambda T, i: gg.flash_attn_ext(T((1, 4, 8, 32), "f32"), T((1, 4, 8, 32)), T((1, 4, 8, 32))),
    "mul_mat f32 a": lambda T, i: gg.mul_mat(T((4, 32), "f32"), T((4, 32))),
    "add f32 a": lambda T, i: T((4, 32), "f32") + T((4, 32)),
    "concat f32 a": lambda T, i: gg.concat(T((4, 32), "f32"), T((4, 32)), 0),
    "cpy from f32": lambda T, i: gg.cpy(T((4, 32), "f32"), T((4, 32))),
    "soft_max f16 mask": lambda T, i: gg.soft_max(T((4, 32), "f32"), mask=T((4, 32))),
    "argsort": lambda T, i: gg.argsort(T((4, 32))), "top_k": lambda T, i: gg.top_k(T((4, 32)), 3),
    "soft_max": lambda T, i: gg.soft_max(T((4, 32))), "norm": lambda T, i: gg.norm(T((4, 32))),
    "rms_norm": lambda T, i: gg.rms_norm(T((4, 32))), "group_norm": lambda T, i: gg.group_norm(T((1, 4, 8, 32)), 2),
    "rope_ext": lambda T, i: gg.rope_ext(T((1, 4, 2, 32)), i), "conv_2d": lambda T, i: gg.conv_2d(T((2, 4, 3, 3)), T((1, 4, 8, 32))),
    "conv_1d": lambda T, i: gg.conv_1d(T((2, 4, 3)), T((1, 4, 32))), "im2col": lambda T, i: gg.im2col(T((2, 4, 3, 3)), T((1, 4, 8, 32))),
    "pool_2d": lambda T, i: gg.pool_2d(T((1, 4, 8, 32)), 2),
    "flash_attn_ext": lambda T, i: gg.flash_attn_ext(T((1, 4, 8, 32)), T((1, 4, 8, 32)), T((1, 4, 8, 32))),
}
counts = {"computed": 0, "refused": 0}
cuda = [d for d in gg.devices() if d.name.startswith("CUDA")]     # on the GPU machine
for dev in [gg.device("CPU"), rpc, *cuda]:
    be = dev.backend()
    for op, build in OPS.items():
        for ty in TYPES:
            print(dev.name, op, ty, flush=True)
            with gg.Context() as ctx:
                made = []
                def T(shape, t=ty):
                    made.append(ctx.tensor(gg.TYPES[t], shape)); return made[-1]
                idx = ctx.tensor(gg.i32, (4,))
                try:
                    out = build(T, idx)
                except gg.GGMLError:
                    counts["refused"] += 1
                    continue
                ctx.alloc(be)
                idx.set(np.array([3, 0, 2, 1], np.int32))
                for m in made:            # some values in every input (quantized ones too)
                    if m.type.name in ("f32", "f16", "bf16", "f64") or m.type.block_size > 1:
                        m.set(np.full(m.shape, 0.5, np.float32).astype(m.dtype or np.float32))
                try:
                    be.compute(gg.Graph(out))
                    counts["computed"] += 1
                except gg.GGMLError:
                    counts["refused"] += 1
            # a bad index is refused at compute time, not by ggml's assert
        with gg.Context() as ctx:
            table, idx = ctx.tensor(gg.f32, (4, 8)), ctx.tensor(gg.i32, (2,))
            ctx.alloc(be)
            idx.set(np.array([1, 9], np.int32))
            try:
                be.compute(gg.Graph(gg.get_rows(table, idx)))
                raise SystemExit("an out-of-range index was not refused")
            except gg.InvalidArgument:
                pass
    be.close()
print("summary", counts["computed"], counts["refused"])
'''


def test_every_op_with_every_type_refuses_or_computes():
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    assert r.returncode == 0, f"the process died at: {last}\n{r.stderr[-2000:]}"
    _, computed, refused = last.split()
    assert int(computed) > 100 and int(refused) > 100       # both outcomes are exercised
