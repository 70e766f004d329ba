"""``python -m ggml_py``: what this build sees, and a matmul on every device checked against numpy.

    python -m ggml_py                 # table of registries, devices, buffer types + matmul check
    python -m ggml_py rpc-server ...  # serve devices over ggml's RPC (see --help)
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def matmul_check(dev, m=64, k=128, n=32, seed=0) -> float:
    """Compute A @ B on `dev`; return the NMSE against numpy (test-backend-ops' metric)."""
    import ggml_py as gg
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    with dev.backend() as be, gg.Context() as ctx:
        a, b = ctx.from_numpy(A, "A"), ctx.from_numpy(B, "B")
        ctx.alloc(be)
        a.set(A)
        b.set(B)
        c = a @ b
        be.compute(gg.Graph(c))
        got = c.numpy(copy=True)
    ref = A @ B
    return float(np.sum((got - ref) ** 2) / np.sum(ref ** 2))


def show(out=sys.stdout) -> int:
    import ggml_py as gg
    info = gg.build_info()
    print(f"ggml {gg.ggml_version()}  build {info['folder']}  ({info['bindings']} bindings, "
          f"{info['functions']} functions)", file=out)
    print("\nregistries:", ", ".join(f"{r.name} ({len(r.devices)})" for r in gg.registries()), file=out)
    print(f"\n{'device':<10} {'type':<6} {'memory free/total':<22} {'caps':<34} description", file=out)
    for d in gg.devices():
        free, total = d.memory
        c = d.caps
        caps = ",".join(n for n, v in (("async", c.async_), ("host_buffer", c.host_buffer),
                                       ("from_host_ptr", c.buffer_from_host_ptr),
                                       ("events", c.events)) if v) or "-"
        print(f"{d.name:<10} {d.type:<6} {_gib(free) + ' / ' + _gib(total):<22} {caps:<34} "
              f"{d.description}", file=out)
        for b in d.buffer_types:
            print(f"{'':<10}   buffer type {b.name:<16} align {b.alignment:<5} host={b.is_host}", file=out)
    print("\nmatmul 64x128 @ 128x32, f32, NMSE vs numpy (threshold 5e-4):", file=out)
    failed = 0
    for d in gg.devices():
        try:
            err = matmul_check(d)
            ok = err < 5e-4
        except gg.GGMLError as e:
            err, ok = str(e), False
        failed += not ok
        print(f"  {d.name:<10} {'ok  ' if ok else 'FAIL'} {err}", file=out)
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "rpc-server":
        from .rpc import server_main
        return server_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m ggml_py", description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    return show()


if __name__ == "__main__":
    sys.exit(main())
