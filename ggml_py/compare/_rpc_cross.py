"""Child process: does a client of this build talk to an RPC server of another build?

    GGML_PY_BUILD=<client build> python -m ggml_py.compare._rpc_cross <server build folder>

Starts ``python -m ggml_py rpc-server`` of the server build (``gg.rpc.serve(build=...)``),
asks it HELLO the way ggml_py does (its verdict, printed as ``hello ...``), then connects with
ggml's own client, bypassing ggml_py's version check (``ggml_backend_rpc_add_server``, or
``ggml_backend_rpc_add_device`` for ggml 0.9.x), allocates a buffer there and computes an add.
Each step is announced on stdout (``stage NAME``) before it runs: when ggml's client aborts the
process, the parent knows where, and reads ggml's message from stderr. The last line is one
JSON object when the process lived to print it.
"""
from __future__ import annotations

import json
import sys


def _ggml_client_devices(ep: str) -> list:
    """The devices ggml's own client gets from the server at `ep` (ggml_py's check bypassed)."""
    from ggml_py._features import old_rpc_api
    from ggml_py._loader import backend_fn, ffi, lib
    if old_rpc_api():
        add = backend_fn("ggml_backend_rpc_add_device", "ggml_backend_dev_t (*)(const char *)")
        dev_ptr = add(ep.encode())
        return [] if dev_ptr == ffi.NULL else [dev_ptr]
    add = backend_fn("ggml_backend_rpc_add_server", "ggml_backend_reg_t (*)(const char *)")
    reg = add(ep.encode())
    return [] if reg == ffi.NULL else [lib.ggml_backend_reg_dev_get(reg, i) for i in
                                       range(int(lib.ggml_backend_reg_dev_count(reg)))]


def _computes_an_add(dev_ptr) -> bool:
    """Whether the device `dev_ptr`, reached through ggml's client, computes an add right."""
    import numpy as np

    import ggml_py as gg
    from ggml_py._device import Device
    dev = Device._of(dev_ptr)
    be = dev.backend()
    x = np.arange(64, dtype=np.float32)
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (64,))
        b = ctx.tensor(gg.f32, (64,))
        c = gg.add(a, b)
        ctx.alloc(be)
        a.set(x)
        b.set(2 * x)
        be.compute(gg.Graph(c))
        got = c.numpy(copy=True)
    be.close()
    return bool(np.array_equal(got, 3 * x))


def main(server_folder: str) -> int:
    import ggml_py as gg

    def stage(name: str) -> None:
        print(f"stage {name}", flush=True)

    from ggml_py._log import to_stderr
    to_stderr()        # ggml's lines ("RPC server version mismatch") on stderr for the parent
    out: dict = {"talks": False}
    stage("server start")
    srv = gg.rpc.serve(build=server_folder, threads=1)
    try:
        ep = srv.endpoint
        try:
            out["hello"] = ".".join(map(str, gg.rpc.hello(ep)))
        except gg.GGMLError as e:            # RPCError, RPCVersionError: ggml_py's verdict
            out["hello_error"] = f"{type(e).__name__}: {e}"
        print("hello " + json.dumps({k: v for k, v in out.items() if k.startswith("hello")}),
              flush=True)
        stage("ggml client connects")
        devs = _ggml_client_devices(ep)
        out["devices"] = len(devs)
        if not devs:
            out["error"] = "ggml's client got no device from the server"
            return _done(out, srv)
        stage("ggml client computes")
        out["talks"] = _computes_an_add(devs[0])
        if not out["talks"]:
            out["error"] = "the add computed over RPC gave wrong numbers"
        return _done(out, srv)
    except gg.GGMLError as e:
        out["error"] = f"{type(e).__name__}: {e}"
        return _done(out, srv)
    finally:
        srv.close()


def _done(out: dict, srv) -> int:
    out["server_alive"] = bool(srv.alive)
    if not srv.alive and srv.proc.stderr is not None:
        err = srv.proc.stderr.read().decode(errors="replace")
        out["server_stderr"] = " | ".join(ln for ln in err.splitlines() if ln.strip())[-400:]
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
