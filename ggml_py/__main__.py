"""``python -m ggml_py``: what this build sees, and a matmul on every device checked against numpy.

    python -m ggml_py                 # registries, devices, buffer types + a matmul check each
    python -m ggml_py --json          # the same facts as JSON, for scripts
    python -m ggml_py rpc-server ...  # serve devices over ggml's RPC
    python -m ggml_py compare A B     # what changed between two ggml releases or builds
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

import numpy as np

MATMUL_NMSE = 5e-4   # test-backend-ops' threshold for mul_mat

COMMANDS = {
    "rpc-server": "serve this machine's devices over ggml's RPC (see rpc-server --help)",
    "compare": "compare two ggml releases, builds or trees: API, devices, ops, speed",
}


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def matmul_check(dev: Any, m: int = 64, k: int = 128, n: int = 32, seed: int = 0) -> float:
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


def cpu_variant() -> str | None:
    """Which CPU backend module ggml loaded, in a GGML_CPU_ALL_VARIANTS build (e.g.
    "haswell"): the file that holds the CPU registry's features function, as the dynamic
    loader's ``dladdr`` names it (Linux and macOS alike; modules end in .so on both). None
    where the CPU backend is linked in or the loader cannot tell."""
    return _variant_of(_module_file_of_cpu())


def _variant_of(path: str | None) -> str | None:
    name = (path or "").rsplit("/", 1)[-1]
    if name.startswith("libggml-cpu-") and name.endswith(".so"):
        return name[len("libggml-cpu-"):-len(".so")]
    return None


def _module_file_of_cpu() -> str | None:
    import ctypes
    import ggml_py as gg
    cpu = [r for r in gg.registries() if r.name == "CPU"]
    addr = cpu[0].proc_address("ggml_backend_get_features") if cpu else None
    if addr is None:
        return None

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    info = DlInfo()
    raw = int(gg.ffi.cast("uintptr_t", addr))
    if not dladdr(ctypes.c_void_p(raw), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def facts() -> dict[str, Any]:
    """The build, registries and devices as plain data (stable keys: see `--json`)."""
    import ggml_py as gg
    info = gg.build_info()
    devs = []
    for d in gg.devices():
        entry: dict[str, Any] = {"name": d.name, "type": d.type, "description": d.description,
                                 "registry": d.registry.name, "device_id": None,
                                 "unreachable": None}
        try:
            free, total = d.memory
            entry.update({
                "device_id": d.device_id,
                "memory": {"free": free, "total": total},
                "caps": {k.rstrip("_"): bool(v) for k, v in d.caps._asdict().items()},
                "buffer_types": [{"name": b.name, "alignment": b.alignment,
                                  "is_host": b.is_host} for b in d.buffer_types],
            })
        except gg.RPCError as e:      # an RPC device added earlier whose server has gone
            entry.update({"memory": None, "caps": {}, "buffer_types": [], "unreachable": str(e)})
        devs.append(entry)
    return {
        "ggml_version": gg.ggml_version(),
        "build": {"folder": info["folder"], "release": info["release"],
                  "backends": info["backends"], "bindings": info["bindings"],
                  "functions": info["functions"],
                  "backend_dl": bool(gg.BUILD.get("backend_dl")),
                  "cpu_variant": cpu_variant()},
        "registries": [{"name": r.name, "devices": len(r.devices)} for r in gg.registries()],
        "devices": devs,
    }


def show(out: TextIO = sys.stdout, as_json: bool = False) -> int:
    import ggml_py as gg
    f = facts()
    checks = {}
    for d in gg.devices():
        try:
            err: float | str = matmul_check(d)
            ok = isinstance(err, float) and err < MATMUL_NMSE
            result = "ok" if ok else "fail"
        except gg.RPCError as e:
            # an RPC device whose server is gone (added earlier in this process): its memory
            # cannot be reached, so nothing was checked and nothing wrong was computed
            err, ok, result = str(e), False, "unreachable"
        except gg.UnsupportedError as e:
            # the device cannot run this matmul at all (Metal on a paravirtual GPU without
            # simdgroup reduction, as on hosted macOS runners): nothing wrong was computed
            err, ok, result = str(e), False, "unsupported"
        except gg.GGMLError as e:
            err, ok, result = str(e), False, "fail"
        checks[d.name] = {"ok": ok, "result": result, "nmse": err if isinstance(err, float) else None,
                          "error": None if isinstance(err, float) else err}
    failed = sum(c["result"] == "fail" for c in checks.values())
    if as_json:
        for d in f["devices"]:
            d["matmul_check"] = checks[d["name"]]
        json.dump(f, out, indent=2)
        out.write("\n")
        return 1 if failed else 0

    b = f["build"]
    print(f"ggml {f['ggml_version']}  build {b['folder']}  ({b['bindings']} bindings, "
          f"{b['functions']} functions)", file=out)
    if b["backend_dl"]:
        print(f"backends loaded as modules (GGML_BACKEND_DL); CPU variant: "
              f"{b['cpu_variant'] or 'unknown'}", file=out)
    print("\nregistries:", ", ".join(f"{r['name']} ({r['devices']})" for r in f["registries"]),
          file=out)
    print(f"\n{'device':<10} {'type':<6} {'memory free/total':<22} {'caps':<34} description",
          file=out)
    for d in f["devices"]:
        caps = ",".join(k.replace("buffer_from_host_ptr", "from_host_ptr")
                        for k, v in d["caps"].items() if v) or "-"
        mem = "unreachable" if d["memory"] is None else \
            _gib(d["memory"]["free"]) + " / " + _gib(d["memory"]["total"])
        where = f"  [{d['device_id']}]" if d["device_id"] else ""
        print(f"{d['name']:<10} {d['type']:<6} {mem:<22} {caps:<34} {d['description']}{where}",
              file=out)
        for bt in d["buffer_types"]:
            print(f"{'':<10}   buffer type {bt['name']:<16} align {bt['alignment']:<5} "
                  f"host={bt['is_host']}", file=out)
    print(f"\nmatmul 64x128 @ 128x32, f32, NMSE vs numpy (threshold {MATMUL_NMSE:g}):", file=out)
    for name, c in checks.items():
        label = {"ok": "ok  ", "fail": "FAIL"}.get(str(c["result"]), str(c["result"]))
        print(f"  {name:<10} {label} {c['nmse'] if c['error'] is None else c['error']}",
              file=out)
    return 1 if failed else 0


USAGE = """python -m ggml_py [-h] [--version] [--json]
       python -m ggml_py rpc-server [options]    (rpc-server --help)
       python -m ggml_py compare A [B] [options]  (compare --help)"""


def version_line() -> str:
    """"ggml_py X (ggml R, build FOLDER)"; the build part only where a build loads."""
    import ggml_py as gg
    try:
        return f"ggml_py {gg.__version__} (ggml {gg.ggml_version()}, build {gg.BUILD_DIR.name})"
    except ImportError as e:      # (no build: the version alone, and why)
        return f"ggml_py {gg.__version__} ({e})"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ggml_py", usage=USAGE,
        description="Without a command: list this build's registries, devices and buffer types, "
                    "and check a matmul against numpy on every device (exit 1 if one fails; "
                    "a device that does not support it is reported as unsupported).",
        epilog="commands:\n" + "\n".join(f"  {k:<12} {v}" for k, v in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true",
                   help="print the facts and checks as JSON (keys: ggml_version, build, "
                        "registries, devices)")
    p.add_argument("--version", action="store_true",
                   help="print ggml_py's version and the loaded ggml release, and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "rpc-server":
            from ._rpc_server import main as server_main
            return server_main(argv[1:])
        if argv and argv[0] == "compare":
            try:
                from .compare import main as compare_main
            except ImportError as e:
                print(f"python -m ggml_py compare: not available in this installation ({e})",
                      file=sys.stderr)
                return 2
            return int(compare_main(argv[1:]))
        args = _parser().parse_args(argv)
        if args.version:
            print(version_line())
            return 0
        return show(as_json=args.json)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
