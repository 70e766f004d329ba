"""build_ggml.py as a user meets it: bad input gives one clear line and a non-zero exit, and
leaves nothing half-written behind."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ggml_build import BuildError, pins

ROOT = Path(__file__).resolve().parents[2]


def build(*args, env=None, timeout=600):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, str(ROOT / "build_ggml.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, env=e, timeout=timeout)


def one_error_line(proc):
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("build_ggml.py: error: ")
    return lines[0]


def test_unknown_release():
    line = one_error_line(build("--ggml", "9.9.9"))
    assert "unknown ggml release '9.9.9'" in line and "0.25.3" in line


def test_source_that_is_not_a_ggml_tree(tmp_path):
    line = one_error_line(build("--source", str(tmp_path)))
    assert "is not a ggml tree" in line


def test_hash_mismatch_is_refused(tmp_path):
    pin = pins.pin_for("0.10.1")
    (tmp_path / pin.file).write_bytes(b"not the pinned archive")
    assert pins.extracted_tree(pin) is None or pytest.skip("0.10.1 already extracted here")
    line = one_error_line(build("--ggml", "0.10.1", env={"GGML_PY_CACHE": str(tmp_path)}))
    assert "sha256 mismatch" in line and pin.sha256 in line
    assert not (ROOT / "vendor" / "0.10.1").exists()
    with pytest.raises(BuildError, match="sha256 mismatch"):
        pins.fetch(pin, cache=tmp_path)


def test_no_package_index(tmp_path):
    pin = pins.pin_for("0.10.1")
    if pins.extracted_tree(pin):
        pytest.skip("0.10.1 already extracted here")
    env = {"GGML_PY_CACHE": str(tmp_path), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "",
           "PIP_CONFIG_FILE": os.devnull}
    line = one_error_line(build("--ggml", "0.10.1", env=env))
    assert "could not download ggml-py==0.10.1" in line
    assert list(tmp_path.iterdir()) == []   # no partial archive, no temp folder


def test_unwritable_cache(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    pin = pins.pin_for("0.10.1")
    if pins.extracted_tree(pin):
        pytest.skip("0.10.1 already extracted here")
    line = one_error_line(build("--ggml", "0.10.1", env={"GGML_PY_CACHE": str(blocker / "cache")}))
    assert "not writable" in line and "GGML_PY_CACHE" in line


def test_missing_cmake(tmp_path):
    try:
        import cmake  # noqa: F401
        pytest.skip("the cmake wheel is installed; it would be used")
    except ImportError:
        pass
    line = one_error_line(build("--ggml", "0.25.3", env={"PATH": str(tmp_path)}))
    assert "not found" in line and "install" in line


def loaded_build_args() -> list[str]:
    """build_ggml.py options that name the build this process loaded (on a GPU machine the
    plain default would be another, CUDA, configuration: a second full build)."""
    import ggml_py as gg
    cmake = gg.BUILD["inputs"]["cmake"]
    args = ["--ggml", gg.BUILD["release"], "--backends", ",".join(gg.BUILD["backends"])]
    arch = cmake.get("CMAKE_CUDA_ARCHITECTURES")
    if arch and arch != "native":
        args += ["--cuda-arch", arch]
    if gg.BUILD.get("backend_dl"):
        args.append("--portable")
    if cmake.get("GGML_NATIVE") == "ON":
        args.append("--native")
    return args


def test_rebuild_with_nothing_changed_does_no_work():
    import ggml_py as gg
    if gg.BUILD["inputs"].get("source"):
        pytest.skip("the loaded build is of a local tree")
    first = build(*loaded_build_args())
    assert first.returncode == 0, first.stderr
    assert Path(first.stdout.strip().splitlines()[-1]) == gg.BUILD_DIR
    again = build(*loaded_build_args())
    assert again.returncode == 0, again.stderr
    out = Path(again.stdout.strip().splitlines()[-1])
    assert out.is_dir() and (out / "build.json").exists()
    assert "generating cffi bindings" not in again.stdout
    log = (ROOT / "build" / out.name / "build.log").read_text()
    assert "no work to do" in log


def test_wrapper_builds_a_tree_that_does_not_configure_standalone():
    # The default's tree (0.26.0, from llama.cpp as 0.25.3's) has no ggml.pc.in, so only the
    # wrapper can build it.
    tree = pins.extracted_tree(pins.pin_for(pins.load_manifest()[0]))
    assert tree is not None and not (tree / "ggml.pc.in").exists()
