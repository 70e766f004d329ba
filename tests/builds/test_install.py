"""The install path a stranger takes: fetching on its own, offline archives, and a failed build
failing pip instead of leaving an "installed" package without a library."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import skip_without_index

from ggml_build import BuildError, pins

ROOT = Path(__file__).resolve().parents[2]
DEFAULT, RELEASES = pins.load_manifest()


def cached_archive(release=DEFAULT) -> Path:
    pin = pins.pin_for(release)
    archive = pins.cache_dir() / pin.file
    if not archive.exists():
        pytest.skip(f"{pin.file} is not in the sdist cache {pins.cache_dir()}")
    return archive


def test_fetch_from_a_local_archive_verifies_and_caches_it(tmp_path):
    src = cached_archive()
    pin = pins.pin_for(DEFAULT)
    got = pins.fetch(pin, cache=tmp_path / "cache", origin=src)
    assert got == tmp_path / "cache" / pin.file and pins.sha256_of(got) == pin.sha256
    # a folder holding the archive works too
    again = pins.fetch(pin, cache=tmp_path / "cache2", origin=src.parent)
    assert again.exists()


def test_fetch_from_a_wrong_archive_is_refused(tmp_path):
    pin = pins.pin_for(DEFAULT)
    bogus = tmp_path / pin.file
    bogus.write_bytes(b"not the pinned archive")
    with pytest.raises(BuildError, match="sha256 mismatch"):
        pins.fetch(pin, cache=tmp_path / "cache", origin=bogus)
    assert not (tmp_path / "cache" / pin.file).exists()
    with pytest.raises(BuildError, match="does not exist"):
        pins.fetch(pin, cache=tmp_path / "cache", origin=tmp_path / "nope.tar.gz")


def test_fetch_subcommand_help_and_list():
    r = subprocess.run([sys.executable, "build_ggml.py", "fetch", "--help"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--from FILE" in r.stdout and "--all" in r.stdout
    r = subprocess.run([sys.executable, "build_ggml.py", "--list"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for rel in RELEASES:
        assert rel in r.stdout
    assert f"{DEFAULT}*" in r.stdout


def _copy_tree(dest: Path) -> Path:
    """The committed files of this checkout (what a fresh clone holds), plus nothing else."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if files.returncode != 0:
        pytest.skip("not a git checkout")
    for rel in files.stdout.splitlines():
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.slow
def test_a_failed_build_fails_pip(tmp_path):
    """A wrong archive in the cache (the hash check fails before anything is compiled):
    `pip wheel` must exit non-zero and say why. (It used to succeed without a library.)"""
    tree = _copy_tree(tmp_path / "src")
    cache = tmp_path / "cache"
    cache.mkdir()
    pin = pins.pin_for(DEFAULT)
    (cache / pin.file).write_bytes(b"not the pinned archive")
    env = dict(os.environ, GGML_PY_CACHE=str(cache))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w",
                        str(tmp_path / "dist"), str(tree)], capture_output=True, text=True,
                       env=env, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    if "sha256 mismatch" not in out:
        skip_without_index(out, "pip's isolated build environment")
    assert "sha256 mismatch" in out and "building ggml failed" in out
    assert not list(tmp_path.glob("dist/*.whl"))
