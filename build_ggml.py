#!/usr/bin/env python3
"""Build a pinned upstream ggml release into shared libraries plus generated cffi bindings.

    python build_ggml.py                          # default release, default backends
    python build_ggml.py --ggml 0.20.2            # another pinned release, side by side
    python build_ggml.py --source ~/llama.cpp/ggml   # a local, unreleased tree
    python build_ggml.py --backends cpu,rpc,cuda --cuda-arch 90
    python build_ggml.py --backends cpu,rpc,vulkan
    python build_ggml.py --portable               # backends as modules, every CPU variant
    python build_ggml.py --list                   # the pins, what each adds, what is built
    python build_ggml.py fetch [--ggml 0.26.0 | --all] [--from FILE]   # download/verify only

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
from ggml_build.progress import Progress

ROOT = Path(__file__).resolve().parent
LIB_ROOT = ROOT / "ggml_py" / "lib"
BUILD_ROOT = pins.work_root() / "build"   # the checkout's build/ (installed: beside the cache)
GENERATOR = [Path(bindings.__file__), Path(bindings.__file__).with_name("helpers.c"),
             Path(cmake.__file__), Path(flags.__file__)]
_LIB = re.compile(r"^lib(ggml[\w-]*)\.(so|dylib)$")


def parse_args(argv=None) -> argparse.Namespace:
    default, releases = pins.load_manifest()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["fetch"]:
        return _parse_fetch(argv[1:], default, releases)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--ggml", default=default, metavar="VERSION",
                     help=f"pinned release to build (default {default}; "
                          f"known: {', '.join(releases)})")
    src.add_argument("--source", type=Path, metavar="PATH",
                     help="build a local ggml tree instead of a pinned release")
    src.add_argument("--list", action="store_true",
                     help="list the pinned releases, what each adds, and which are built")
    p.add_argument("--backends", metavar="LIST",
                   help="comma list of cpu,rpc,metal,cuda,vulkan (cpu and rpc always; "
                        "default: metal on macOS, cuda when nvcc and an NVIDIA GPU are present)")
    p.add_argument("--cuda-arch", metavar="ARCH", help="CMAKE_CUDA_ARCHITECTURES, e.g. 90")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2)
    p.add_argument("--native", action="store_true", help="GGML_NATIVE=ON (tune for this CPU)")
    p.add_argument("--portable", action="store_true",
                   help="for wheels meant for other machines: GGML_BACKEND_DL=ON and "
                        "GGML_CPU_ALL_VARIANTS=ON (the best CPU variant is chosen at run time)")
    p.add_argument("--abi", action="store_true",
                   help="write ABI-mode bindings (no compiled module) instead of API mode")
    p.add_argument("--with-tests", action="store_true",
                   help="also build upstream's test-backend-ops (for benchmarks)")
    p.add_argument("--clean", action="store_true", help="start the build folder afresh")
    p.add_argument("--lib-root", type=Path, default=LIB_ROOT,
                   help=f"where output folders go (default {LIB_ROOT.relative_to(ROOT)})")
    args = p.parse_args(argv)
    args.command = "list" if args.list else "build"
    return args


def _parse_fetch(argv, default, releases) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="build_ggml.py fetch",
        description="Download a pinned release's sdist (into $GGML_PY_CACHE, default "
                    "~/.cache/ggml_py/sdists), verify its sha256, and extract its ggml tree "
                    "under vendor/<release>/. Nothing is compiled.")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--ggml", default=default, metavar="VERSION",
                       help=f"pinned release (default {default}; known: {', '.join(releases)})")
    which.add_argument("--all", action="store_true", help="every pinned release")
    p.add_argument("--from", dest="origin", type=Path, metavar="FILE",
                   help="an sdist already downloaded (offline machines): verified and used "
                        "instead of downloading; a folder holding it also works")
    args = p.parse_args(argv)
    args.command = "fetch"
    return args


def fetch(args) -> None:
    _, releases = pins.load_manifest()
    for rel in (releases if args.all else [args.ggml]):
        tree = pins.prepare(rel, origin=args.origin)
        print(f"ggml {rel}: {tree}")


def list_releases(args) -> None:
    default, releases = pins.load_manifest()
    built = {}
    for info in sorted(args.lib_root.glob("*/build.json")):
        try:
            rel = json.loads(info.read_text())["release"]
        except (ValueError, KeyError):
            continue
        built.setdefault(rel, []).append(info.parent.name)
    print(f"{'release':<9} {'sdist':<32} {'fetched':<8} built")
    for rel in sorted(releases, key=pins._version_key, reverse=True):
        pin = releases[rel]
        mark = "*" if rel == default else " "
        fetched = "yes" if pins.extracted_tree(pin) else "no"
        print(f"{rel + mark:<9} {pin.package + '==' + pin.version:<32} {fetched:<8} "
              f"{', '.join(built.get(rel, [])) or '-'}")
        if pin.notes:
            print(f"{'':<10}{pin.notes}")
    print("\n* the default release (vendor/releases.toml)")


def library_files(out: Path, backend_dl: bool = False) -> list[Path]:
    """The ggml shared libraries of an output folder (libggml*.so / .dylib) that the bindings
    link. With GGML_BACKEND_DL the backends are modules ggml loads at run time: only libggml
    and libggml-base are linked, backend functions are reached through the registry."""
    found = sorted(p for p in out.iterdir() if _LIB.match(p.name))
    if backend_dl:
        found = [p for p in found if _LIB.match(p.name).group(1) in ("ggml", "ggml-base")
                 or p.name.startswith("libggml-py-")]   # ggml_py's own C helpers
    return found


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
    progress = Progress()
    plat = flags.Platform.detect()
    backends = flags.parse_backends(args.backends, plat)
    if args.cuda_arch and "cuda" not in backends:
        raise BuildError("--cuda-arch given but cuda is not among the backends",
                         "add cuda to --backends")
    if "cuda" in backends and not args.cuda_arch and not plat.nvidia_gpu:
        raise BuildError("--backends cuda without a visible NVIDIA GPU: CMake's 'native' "
                         "architecture needs one",
                         "name the GPU architecture to build for, e.g. --cuda-arch 90 (H100/H200)"
                         " or 89 (RTX 40xx)")
    tools = cmake.find_tools()
    if args.source is not None:
        tree = pins.check_source(args.source)
        release = pins.tree_version(tree)
        pin_sha = None
    else:
        pin = pins.pin_for(args.ggml)
        tree = pins.prepare(args.ggml, log=progress.phase)
        release, pin_sha = args.ggml, pin.sha256
    name = flags.config_name(release, backends, native=args.native, cuda_arch=args.cuda_arch,
                             source=str(tree) if args.source else None, portable=args.portable)
    out = args.lib_root / name
    build = BUILD_ROOT / name
    cfg = flags.cmake_flags(backends, plat, native=args.native, cuda_arch=args.cuda_arch,
                            portable=args.portable)
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
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        build.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot create {e.filename}: {e.strerror}",
                         "run from a writable checkout, or pass --lib-root DIR") from None
    log_file = build / "build.log"
    log_file.write_text(f"build_ggml.py {' '.join(sys.argv[1:])}\n")
    progress.phase(f"ggml {release} [{', '.join(backends)}{', portable' if args.portable else ''}]"
                   f" -> {out}")
    try:
        _compile_and_bind(args, tools, tree, build, out, cfg, inputs, old, log_file, progress,
                          name=name, release=release, backends=backends, pin_sha=pin_sha)
    except BaseException:
        # a failed build must not look like a build: no build.json (the loader lists only
        # folders with one), and no folder at all when this run created it
        info_path.unlink(missing_ok=True)
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    progress.phase(f"done in {progress.elapsed():.1f} s")
    print(out)
    return out


def _compile_and_bind(args, tools, tree, build, out, cfg, inputs, old, log_file, progress, *,
                      name, release, backends, pin_sha) -> None:
    info_path = out / "build.json"
    same_config = (old.get("inputs", {}).get("cmake") == inputs["cmake"]
                   and old.get("inputs", {}).get("tree") == str(tree))
    if not same_config or args.with_tests or not (build / "cmake" / "build.ninja").exists():
        progress.phase("configure (cmake)")
        cmake.configure(tools, tree, build, out, cfg, log_file, progress=progress)
    targets = ("all", "test-backend-ops") if args.with_tests else ()
    progress.phase(f"compile (ninja -j{args.jobs})")
    cmake.build(tools, tree, build, args.jobs, log_file, targets=targets, progress=progress)

    for stale in out.glob("lib*.so.*"):
        stale.unlink()      # versioned names of older builds of this folder (now unversioned)
    libs = library_files(out, backend_dl=args.portable)
    if not libs:
        raise BuildError(f"the build produced no libggml*.so in {out}",
                         f"read {log_file}")
    module = next(out.glob(f"{bindings.MODULE}*"), None)
    newest_lib = max(p.stat().st_mtime for p in libs)
    if (old.get("inputs") != inputs or module is None
            or module.stat().st_mtime < newest_lib):
        progress.phase("generating cffi bindings")
        info_path.unlink(missing_ok=True)
        summary = bindings.generate(out, tree / "include",
                                    bindings.headers_for(tree / "include", backends),
                                    libs, release, abi=args.abi)
        info = {"name": name, "release": release, "sdist_sha256": pin_sha,
                "ggml_commit": _tree_commit(log_file, old), "backends": list(backends),
                "backend_dl": bool(args.portable), "inputs": inputs, **summary,
                "libraries": [p.name for p in libs]}
        tmp = info_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(tmp, info_path)   # build.json last: a folder without it is not a finished build


def _tree_commit(log_file: Path, old: dict) -> str:
    """The commit ggml's CMake reported for the tree at configure time ("unknown" for trees
    extracted from sdists: see cmake._git_env), else what the previous build recorded."""
    m = re.search(r"ggml commit:\s+(\S+)", log_file.read_text(errors="replace"))
    return m.group(1) if m else old.get("ggml_commit", "unknown")


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        if args.command == "fetch":
            fetch(args)
        elif args.command == "list":
            list_releases(args)
        else:
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
