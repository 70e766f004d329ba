"""Child process: the API and runtime facts of the one build this process loads.

    GGML_PY_BUILD=<folder> python -m ggml_py.compare._probe   # one JSON object on stdout

The API comes from the compiled bindings, not from reading headers: in an API-mode build cffi
asked the C compiler for every struct's size, alignment and field offsets and for every enum
value and integer constant (an ABI-mode build only knows what the cdef declares, which the
output says under ``layout_source``).
"""
from __future__ import annotations

import json
import re
import sys


def _enums(ffi, folder, typedefs) -> tuple[dict, set]:
    """The enums the bindings know (named in cdef.h or a typedef) and their members' names."""
    enum_names: set[str] = set()
    cdef = folder / "cdef.h"
    if cdef.exists():
        enum_names.update(f"enum {n}" for n in re.findall(r"\benum\s+(\w+)", cdef.read_text()))
    for name in typedefs:
        try:
            if ffi.typeof(name).kind == "enum":
                enum_names.add(name)
        except (ffi.error, TypeError):
            pass

    enums, members = {}, set()
    for name in sorted(enum_names):
        try:
            ct = ffi.typeof(name)
        except (ffi.error, TypeError):
            continue
        if ct.kind != "enum" or ct.cname in enums:
            continue
        vals = {k: int(v) for k, v in sorted(ct.relements.items(), key=lambda kv: kv[1])}
        enums[ct.cname] = vals
        members.update(vals)
    return enums, members


def _functions_and_constants(ffi, lib, members: set) -> tuple[dict, dict]:
    """The library's functions (signatures) and integer constants that are no enum member."""
    functions, constants = {}, {}
    for name in dir(lib):
        try:
            obj = getattr(lib, name)
        except Exception:                 # declared but not exported by this build
            continue
        if isinstance(obj, int):
            if name not in members:
                constants[name] = int(obj)
            continue
        try:
            ct = ffi.typeof(obj)
        except (TypeError, ffi.error):
            continue
        if ct.kind == "pointer":
            ct = ct.item
        if ct.kind != "function":
            continue
        functions[name] = {"result": ct.result.cname, "args": [a.cname for a in ct.args],
                           "variadic": bool(ct.ellipsis)}
    return functions, constants


def _layouts(ffi, structs, unions) -> dict:
    """Every struct's and union's size, alignment and fields, or opaque where incomplete."""
    layouts = {}
    for kind, names in (("struct", structs), ("union", unions)):
        for name in names:
            cname = f"{kind} {name}"
            try:
                ct = ffi.typeof(cname)
            except (ffi.error, TypeError):
                continue
            try:
                ffi.sizeof(ct)      # completes the lazily built type before its fields are read
            except ffi.error:
                layouts[cname] = {"opaque": True}
                continue
            fields = ct.fields
            layouts[cname] = {
                "opaque": False, "size": ffi.sizeof(ct), "align": ffi.alignof(ct),
                "fields": [{"name": n, "type": f.type.cname, "offset": f.offset,
                            "bits": f.bitsize if f.bitsize >= 0 else None}
                           for n, f in fields]}
    return layouts


def api(ffi, lib, info: dict, folder) -> dict:
    typedefs, structs, unions = ffi.list_types()
    enums, members = _enums(ffi, folder, typedefs)
    functions, constants = _functions_and_constants(ffi, lib, members)
    return {"layout_source": "compiler" if info.get("bindings") == "api" else "cdef",
            "functions": functions, "structs": _layouts(ffi, structs, unions), "enums": enums,
            "constants": constants}


def _caps(ffi, lib, dev_ptr) -> dict:
    """Every field of ``struct ggml_backend_dev_caps`` (new ones appear by themselves)."""
    props = ffi.new("struct ggml_backend_dev_props *")
    lib.ggml_backend_dev_get_props(dev_ptr, props)
    return {name.rstrip("_"): bool(getattr(props.caps, name))
            for name, _ in ffi.typeof("struct ggml_backend_dev_caps").fields}


#: what a registry may offer through ggml_backend_reg_get_proc_address (the backend
#: communicators of tensor parallelism and the other "common functions" of ggml-backend.h)
PROCS = ("ggml_backend_comm_init", "ggml_backend_comm_free", "ggml_backend_comm_allreduce_tensor",
         "ggml_backend_split_buffer_type", "ggml_backend_set_n_threads",
         "ggml_backend_dev_get_extra_bufts", "ggml_backend_get_features",
         "ggml_backend_set_abort_callback")
#: library symbols looked up in the build's shared libraries (not all are in the bindings)
SYMBOLS = ("ggml_backend_meta_device", "ggml_backend_meta_split_axis_name",
           "ggml_backend_sched_set_copy_callback", "ggml_backend_buft_alloc_buffer_n")


def extensions(gg, folder) -> dict:
    """{"symbol NAME": present, "REGISTRY: NAME": present}: the meta device and the backend
    communicators (by proc address) and other optional entry points, per side."""
    import ctypes
    from ggml_py._loader import ffi, lib
    out: dict = {}
    libs = []
    for p in sorted(folder.glob("libggml*")):
        try:
            libs.append(ctypes.CDLL(str(p)))
        except OSError:
            pass
    for name in SYMBOLS:
        out[f"symbol {name}"] = any(hasattr(lb, name) for lb in libs)
    for r in gg.registries():
        raw = r.ptr if hasattr(r, "ptr") else None
        if raw is None:
            continue
        for name in PROCS:
            addr = lib.ggml_backend_reg_get_proc_address(raw, name.encode())
            out[f"{r.name}: {name}"] = addr != ffi.NULL
    return out


def runtime(gg) -> dict:
    from ggml_py._loader import ffi, lib
    out: dict = {"rpc": None, "rpc_error": None}
    endpoints: list[str] = []
    proto = tuple(getattr(lib, f"RPC_PROTO_{p}_VERSION", None)
                  for p in ("MAJOR", "MINOR", "PATCH"))
    if "rpc" in gg.build_info()["backends"]:
        try:
            srv = gg.rpc.serve()
            endpoints.append(srv.endpoint)
            out["rpc"] = {"header": ".".join(map(str, proto)) if None not in proto else None,
                          "server": ".".join(map(str, gg.rpc.hello(srv.endpoint))),
                          "endpoint_devices": [d.name for d in gg.rpc.connect(srv.endpoint).devices]}
        except gg.GGMLError as e:
            out["rpc_error"] = f"{type(e).__name__}: {e}"
    out["registries"] = [{"name": r.name, "devices": [d.name for d in r.devices]}
                         for r in gg.registries()]
    devs = []
    for d in gg.devices():
        entry = {"name": d.name, "registry": None, "type": d.type, "description": d.description}
        try:
            entry["memory_total"] = int(d.memory[1])
            entry["caps"] = _caps(ffi, lib, d.ptr)
            entry["buffer_types"] = [{"name": b.name, "alignment": int(b.alignment),
                                      "max_size": int(b.max_size), "is_host": bool(b.is_host)}
                                     for b in d.buffer_types]
            h = d.host_buffer_type
            entry["host_buffer_type"] = None if h is None else h.name
        except gg.GGMLError as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        devs.append(entry)
    for r in out["registries"]:
        for e in devs:
            if e["name"] in r["devices"]:
                e["registry"] = r["name"]
    out["devices"] = devs
    from ggml_py._loader import BUILD_DIR
    try:
        out["extensions"] = extensions(gg, BUILD_DIR)
    except Exception as e:              # (an old build without one of these calls)
        out["extensions_error"] = f"{type(e).__name__}: {e}"
    return _without(out, endpoints)


def _without(obj, endpoints: list[str]):
    """`obj` with this run's RPC endpoints (random ports) written as "<endpoint>", so that
    two sides' names and descriptions compare equal."""
    if isinstance(obj, str):
        for e in endpoints:
            obj = obj.replace(e, "<endpoint>")
        return obj
    if isinstance(obj, list):
        return [_without(x, endpoints) for x in obj]
    if isinstance(obj, dict):
        return {_without(k, endpoints): _without(v, endpoints) for k, v in obj.items()}
    return obj


def main() -> int:
    import ggml_py as gg
    from ggml_py._loader import BUILD, BUILD_DIR, ffi, lib
    side = {"version": gg.ggml_version(), "release": BUILD.get("release"),
            "folder": str(BUILD_DIR), "name": BUILD.get("name", BUILD_DIR.name),
            "backends": list(BUILD.get("backends", [])), "bindings": BUILD.get("bindings"),
            "with_tests": _test_binary(BUILD_DIR) is not None}
    report = {"side": side, "api": api(ffi, lib, BUILD, BUILD_DIR), "runtime": runtime(gg)}
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


def _test_binary(folder):
    for p in (folder / "bin" / "test-backend-ops", folder / "test-backend-ops"):
        if p.exists():
            return p
    return None


if __name__ == "__main__":
    sys.exit(main())
