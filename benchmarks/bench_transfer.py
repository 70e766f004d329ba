"""Data movement: set/get of 256 MiB on the CPU device vs numpy.copyto; the zero-copy path;
event round trips on an RPC device.

    python benchmarks/bench_transfer.py
"""
import time

import numpy as np

import ggml_py as gg
from _common import best


def main():
    n = 256 * 2**20 // 4
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    y = np.empty_like(x)
    cpu = gg.device("CPU")
    with cpu.backend() as be, gg.Context() as ctx:
        t = ctx.tensor(gg.f32, (n,))
        ctx.alloc(be)
        copy = best(lambda: np.copyto(y, x))
        set_ = best(lambda: t.set(x))
        get = best(lambda: be.get(t, y))
        gb = x.nbytes / 2**30
        print(f"256 MiB  numpy.copyto {gb / copy:6.2f} GiB/s")
        print(f"         set          {gb / set_:6.2f} GiB/s ({copy / set_:.2f}x copyto)")
        print(f"         get          {gb / get:6.2f} GiB/s ({copy / get:.2f}x copyto)")

    for size in (2**12, 2**20, 2**26):
        a = gg.aligned_empty((size // 4,), np.float32)
        dt = best(lambda: cpu.buffer_from_host(a).close(), repeat=20)
        with cpu.buffer_from_host(a) as buf:
            same = buf.base == a.ctypes.data
        print(f"zero-copy buffer over {size:>9} bytes: {dt * 1e6:7.1f} us, same pointer: {same}")

    srv = gg.rpc.serve()
    gg.rpc.connect(srv.endpoint)
    d = [x for x in gg.devices() if x.description == srv.endpoint][0]
    with d.backend() as b0, d.backend() as b1, d.event() as ev:
        def rt():
            ev.record(b0)
            b1.wait(ev)
            ev.synchronize()
        rt()
        k = 200
        dt = best(lambda: [rt() for _ in range(k)], repeat=3) / k
        print(f"RPC event record+wait+synchronize: {dt * 1e6:.1f} us per round trip")
    srv.close()


if __name__ == "__main__":
    main()
