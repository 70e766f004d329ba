"""RPC over loopback, against baselines measured in the same run:

  1. set/get of a 64 MiB tensor on an RPC device vs sending the same bytes over a plain
     loopback TCP socket (to a Python receiver that discards them);
  2. the scheduler's cost per split: one graph of L layers computed on the CPU alone, then
     with its layers alternating between the CPU and an RPC device (one split per layer), by
     a scheduler; (split time - CPU time) / extra splits.

    python benchmarks/bench_rpc.py
"""
import socket
import threading
import time

import numpy as np

import ggml_py as gg
from _common import best

MiB = 2**20


def tcp_baseline(data: bytes) -> float:
    """Seconds to send `data` over loopback TCP and have the receiver read all of it."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    done = threading.Event()

    def receive():
        conn, _ = server.accept()
        with conn:
            left = len(data)
            buf = bytearray(4 * MiB)
            while left:
                n = conn.recv_into(buf)
                if not n:
                    break
                left -= n
        done.set()

    th = threading.Thread(target=receive)
    th.start()
    with socket.create_connection(("127.0.0.1", port)) as c:
        t = time.perf_counter()
        c.sendall(data)
        done.wait()
        dt = time.perf_counter() - t
    th.join()
    server.close()
    return dt


def transfer(dev, nbytes):
    x = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    y = np.empty_like(x)
    with dev.backend() as be, gg.Context() as ctx:
        t = ctx.tensor(gg.f32, x.shape)
        ctx.alloc(be)
        s = best(lambda: t.set(x), repeat=5)
        g = best(lambda: be.get(t, y), repeat=5)
    assert np.array_equal(x, y)
    tcp = min(tcp_baseline(x.tobytes()) for _ in range(5))
    gb = nbytes / 2**30
    print(f"64 MiB to/from {dev.name}: set {gb / s:.2f} GiB/s, get {gb / g:.2f} GiB/s; raw loopback "
          f"TCP {gb / tcp:.2f} GiB/s (set {tcp / s:.2f}x, get {tcp / g:.2f}x of raw)")


def per_split(cpu, rpc, layers=16, width=256, reps=20):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    x = rng.standard_normal((8, width)).astype(np.float32)
    times = {}
    for mode in ("cpu", "split"):
        bes = [rpc.backend(), cpu.backend()]
        ctx_r, ctx_c = gg.Context(), gg.Context()
        wr, wc, xin = ctx_r.from_numpy(w), ctx_c.from_numpy(w), ctx_c.from_numpy(x)
        ctx_r.alloc(bes[0])
        ctx_c.alloc(bes[1])
        wr.set(w)
        wc.set(w)
        xin.set(x)
        h = xin
        for i in range(layers):
            h = gg.tanh(h @ (wr if mode == "split" and i % 2 else wc))
        with gg.Scheduler(bes) as sched:
            g = gg.Graph(h)
            sched.compute(g)
            splits = sched.n_splits
            times[mode] = (best(lambda: sched.compute(g), repeat=reps), splits)
        ctx_r.close()
        ctx_c.close()
        for b in bes:
            b.close()
    (tc, sc), (ts, ss) = times["cpu"], times["split"]
    print(f"scheduler, {layers} layers of {width}x{width}: CPU only {tc * 1e3:.2f} ms ({sc} split), "
          f"CPU+{rpc.name} {ts * 1e3:.2f} ms ({ss} splits): "
          f"{(ts - tc) / max(ss - sc, 1) * 1e6:.0f} us per extra split")


def main():
    with gg.rpc.serve() as srv:
        (rpc,) = gg.rpc.connect(srv.endpoint).devices
        print(f"ggml {gg.ggml_version()}, RPC server {srv.endpoint}")
        transfer(rpc, 64 * MiB)
        per_split(gg.device("CPU"), rpc)
        gg.rpc.close_dependents(srv.endpoint)


if __name__ == "__main__":
    main()
