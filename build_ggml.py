#!/usr/bin/env python3
"""Build a pinned upstream ggml release into shared libraries plus generated cffi bindings.

    python build_ggml.py                          # default release, default backends
    python build_ggml.py --ggml 0.20.2            # another pinned release, side by side
    python build_ggml.py --source ~/llama.cpp/ggml   # a local, unreleased tree
    python build_ggml.py --backends cpu,rpc,cuda --cuda-arch 90
    python build_ggml.py --backends cpu,rpc,vulkan

Each release and configuration gets its own folder under ggml_py/lib/ (printed last);
``GGML_PY_BUILD=<folder>`` makes ``import ggml_py`` load it. Re-running with nothing changed
only asks ninja whether anything is out of date.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from ggml_build import BuildError, bindings, cmake, flags, pins

ROOT = Path(__file__).resolve().parent
LIB_ROOT = ROOT / "ggml_py" / "lib"
BUILD_ROOT = ROOT / "build"
GENERATOR = [Path(bindings.__file__), Path(cmake.__file__), Path(flags.__file__)]
_LIB = re.compile(r"^lib(ggml[\w-]*)\.(so|dylib)$")


def parse_args(argv=None) -> argparse.Namespace:
    default, releases = pins.load_manifest()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--ggml", default=default, metavar="VERSION",
                     help=f"pinned release to build (default {default}; "
                          f"known: {', '.join(releases)})")
    src.add_argument("--source", type=Path, metavar="PATH",
                     help="build a local ggml tree instead of a pinned release")
    p.add_argument("--backends", metavar="LIST",
                   help="comma list of cpu,rpc,metal,cuda,vulkan (cpu and rpc always; "
                        "default: metal on macOS, cuda when nvcc and an NVIDIA GPU are present)")
    p.add_argument("--cuda-arch", metavar="ARCH", help="CMAKE_CUDA_ARCHITECTURES, e.g. 90")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2)
    p.add_argument("--native", action="store_true", help="GGML_NATIVE=ON (tune for this CPU)")
    p.add_argument("--abi", action="store_true",
                   help="write ABI-mode bindings (no compiled module) instead of API mode")
    p.add_argument("--with-tests", action="store_true",
                   help="also build upstream's test-backend-ops (for benchmarks)")
    p.add_argument("--clean", action="store_true", help="start the build folder afresh")
    p.add_argument("--lib-root", type=Path, default=LIB_ROOT,
                   help=f"where output folders go (default {LIB_ROOT.relative_to(ROOT)})")
    return p.parse_args(argv)


def library_files(out: Path) -> list[Path]:
    """The unversioned ggml shared libraries of an output folder (libggml*.so / .dylib)."""
    return sorted(p for p in out.iterdir() if _LIB.match(p.name))


def _inputs(args, tree: Path, backends, cfg: dict[str, str], release: str) -> dict:
    return {
        "release": release,
        "tree": str(tree),
        "source": str(args.source) if args.source else None,
        "backends": list(backends),
        "cmake": {k: v for k, v in cfg.items() if k != "GGML_PY_TEST_BACKEND_OPS"},
        "abi": args.abi,
        "python": sys.implementation.cache_tag,
        "generator_mtime": max(p.stat().st_mtime for p in GENERATOR),
    }


def run(args) -> Path:
    t0 = time.monotonic()
    plat = flags.Platform.detect()
    backends = flags.parse_backends(args.backends, plat)
    if args.cuda_arch and "cuda" not in backends:
        raise BuildError("--cuda-arch given but cuda is not among the backends",
                         "add cuda to --backends")
    tools = cmake.find_tools()
    if args.source is not None:
        tree = pins.check_source(args.source)
        release = pins.tree_version(tree)
        pin_sha = None
    else:
        pin = pins.pin_for(args.ggml)
        tree = pins.prepare(args.ggml)
        release, pin_sha = args.ggml, pin.sha256
    name = flags.config_name(release, backends, native=args.native, cuda_arch=args.cuda_arch,
                             source=str(tree) if args.source else None)
    out = args.lib_root / name
    build = BUILD_ROOT / name
    cfg = flags.cmake_flags(backends, plat, native=args.native, cuda_arch=args.cuda_arch)
    if "vulkan" in backends:
        from ggml_build import vulkan
        inc = vulkan.include_dir()           # BuildError naming what to install
        if inc != Path("/usr/include"):
            cfg["Vulkan_INCLUDE_DIR"] = str(inc)
    if args.with_tests:
        tests = pins.test_backend_ops(tree) if args.source is None else \
            next(iter(sorted(tree.parent.glob("tests/test-backend-ops.cpp")) +
                      sorted(tree.glob("tests/test-backend-ops.cpp"))), None)
        if tests is None or not tests.exists():
            raise BuildError("this tree has no test-backend-ops.cpp",
                             "build without --with-tests, or use a release whose pin has 'tests'")
        cfg["GGML_PY_TEST_BACKEND_OPS"] = str(tests)
    inputs = _inputs(args, tree, backends, cfg, release)
    info_path = out / "build.json"
    old = json.loads(info_path.read_text()) if info_path.exists() else {}

    if args.clean:
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        old = {}
    try:
        out.mkdir(parents=True, exist_ok=True)
        build.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot create {e.filename}: {e.strerror}",
                         "run from a writable checkout, or pass --lib-root DIR") from None
    log_file = build / "build.log"
    log_file.write_text(f"build_ggml.py {' '.join(sys.argv[1:])}\n")
    print(f"ggml {release} [{', '.join(backends)}] -> {out}")

    same_config = old.get("inputs", {}).get("cmake") == inputs["cmake"] and old.get("inputs", {}).get("tree") == str(tree)
    if not same_config or args.with_tests or not (build / "cmake" / "build.ninja").exists():
        cmake.configure(tools, tree, build, out, cfg, log_file)
    targets = ("all", "test-backend-ops") if args.with_tests else ()
    cmake.build(tools, build, args.jobs, log_file, targets=targets)

    libs = library_files(out)
    if not libs:
        raise BuildError(f"the build produced no libggml*.so in {out}",
                         f"read {log_file}")
    module = next(out.glob(f"{bindings.MODULE}*"), None)
    newest_lib = max(p.stat().st_mtime for p in libs)
    if (old.get("inputs") != inputs or module is None
            or module.stat().st_mtime < newest_lib):
        print("generating cffi bindings")
        summary = bindings.generate(out, tree / "include", bindings.headers_for(tree / "include", backends),
                                    libs, release, abi=args.abi)
        info = {"name": name, "release": release, "sdist_sha256": pin_sha,
                "backends": list(backends), "inputs": inputs, **summary,
                "libraries": [p.name for p in libs]}
        tmp = info_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(tmp, info_path)   # build.json last: a folder without it is not a finished build
    print(f"done in {time.monotonic() - t0:.1f} s")
    print(out)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except BuildError as e:
        print(f"build_ggml.py: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("build_ggml.py: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
