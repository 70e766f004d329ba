"""Which ggml a side is: its version label, a content hash of its tree, and the nearest pinned
release by API (the public functions its headers declare).

Runs in the parent (reads files only, loads no build). The pinned releases' function sets are
committed in release_api.json (``python -m ggml_py.compare._identity --update`` regenerates
them from the extracted trees under vendor/), so a side can be placed without those trees.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RELEASE_API = HERE / "release_api.json"
_DECL = re.compile(r"\b(?:GGML_API|GGML_BACKEND_API|GGML_OPT_API|GGUF_API)\b[^;{]*?\b((?:ggml|gguf)_\w+)\s*\(",
                   re.S)
_EXTS = {".c", ".h", ".cpp", ".hpp", ".cu", ".cuh", ".m", ".metal", ".comp", ".glsl", ".txt",
         ".cmake", ".wgsl", ".cl", ".in"}


def tree_hash(tree: Path) -> str:
    """sha256 over (relative path, content) of the tree's source files (CMakeLists.txt,
    include/, src/, cmake/), in path order: two trees with the same hash build the same."""
    h = hashlib.sha256()
    files = [p for sub in ("include", "src", "cmake") if (tree / sub).is_dir()
             for p in (tree / sub).rglob("*") if p.is_file() and p.suffix in _EXTS]
    files += [tree / "CMakeLists.txt"] if (tree / "CMakeLists.txt").is_file() else []
    for p in sorted(files, key=lambda p: p.relative_to(tree).as_posix()):
        rel = p.relative_to(tree).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def header_functions(tree: Path) -> set[str]:
    """The public functions the tree's headers declare (include/*.h)."""
    names: set[str] = set()
    for p in sorted((tree / "include").glob("*.h")):
        text = re.sub(r"/\*.*?\*/|//[^\n]*", "", p.read_text(errors="replace"), flags=re.S)
        names.update(_DECL.findall(text))
    return names


def release_apis() -> dict[str, list[str]]:
    if RELEASE_API.exists():
        return json.loads(RELEASE_API.read_text())["releases"]
    return {}


def nearest(functions: set[str]) -> dict | None:
    """The pinned release whose function set is nearest (Jaccard), with the difference."""
    best = None
    for rel, names in release_apis().items():
        s = set(names)
        score = len(s & functions) / max(1, len(s | functions))
        if best is None or score > best[0]:
            best = (score, rel, s)
    if best is None:
        return None
    score, rel, s = best
    plus, minus = sorted(functions - s), sorted(s - functions)
    summary = ("the same public functions" if not plus and not minus else
               f"{len(plus)} function(s) more, {len(minus)} fewer")
    return {"release": rel, "similarity": round(score, 4), "summary": summary,
            "more": plus[:30], "fewer": minus[:30]}


def tree_of(build_json: dict) -> Path | None:
    inputs = build_json.get("inputs") or {}
    for key in ("source", "tree"):
        if inputs.get(key) and Path(inputs[key]).is_dir():
            return Path(inputs[key])
    return None


def identify(folder: Path, probed_functions: list[str] | None = None) -> dict:
    """{label, tree, tree_hash, nearest_release} of the build in `folder`."""
    info = json.loads((folder / "build.json").read_text()) if (folder / "build.json").exists() else {}
    tree = tree_of(info)
    out: dict = {"tree": str(tree) if tree else None, "tree_hash": None, "cmake_version": None,
                 "release": info.get("release"), "nearest_release": None}
    if tree is not None:
        out["tree_hash"] = tree_hash(tree)
        try:
            from ggml_build.pins import tree_version
            out["cmake_version"] = tree_version(tree)
        except Exception:
            pass
        funcs = header_functions(tree)
        out["api_from"] = "headers"
    else:
        funcs = {f for f in (probed_functions or []) if f.startswith(("ggml_", "gguf_"))}
        out["api_from"] = "bindings"
    out["public_functions"] = len(funcs)
    if funcs:
        out["nearest_release"] = nearest(funcs)
    return out


def update(vendor: Path) -> dict:
    """release_api.json from the extracted pinned trees under `vendor` (the ones present)."""
    data = {"releases": release_apis()}
    for tree in sorted(vendor.iterdir()):
        if (tree / "include" / "ggml.h").exists():
            data["releases"][tree.name] = sorted(header_functions(tree))
    data["note"] = ("public function names per pinned release, from include/*.h of the tree "
                    "build_ggml.py extracts (python -m ggml_py.compare._identity --update)")
    RELEASE_API.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")
    return data


if __name__ == "__main__":
    if sys.argv[1:2] == ["--update"]:
        vend = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE.parent.parent / "vendor"
        d = update(vend)
        print({k: len(v) for k, v in d["releases"].items()})
