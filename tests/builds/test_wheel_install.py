"""The cold install's download: the pinned archive comes straight from the index's simple page
(no metadata step of the carrying package), from whichever index pip is configured with."""
import shutil
import time

import pytest

from ggml_build import BuildError, pins

DEFAULT, _ = pins.load_manifest()


def _local_index(tmp_path, archive, name):
    """A PEP 503 index in a folder: <root>/<project>/index.html linking the archive."""
    pin = pins.pin_for(DEFAULT)
    proj = tmp_path / "simple" / pin.package.lower().replace("_", "-")
    proj.mkdir(parents=True)
    shutil.copy(archive, proj / name)
    (proj / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>')
    return (tmp_path / "simple").as_uri()


def test_index_urls_follow_pip_settings(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://example.invalid/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///a file:///b")
    assert pins._index_urls() == ["https://example.invalid/simple", "file:///a", "file:///b"]


def test_the_archive_comes_from_a_local_index_without_pip(tmp_path, monkeypatch):
    pin = pins.pin_for(DEFAULT)
    archive = pins.cache_dir() / pin.file
    if not archive.exists():
        pytest.skip(f"{pin.file} is not in the sdist cache")
    monkeypatch.setenv("PIP_INDEX_URL", _local_index(tmp_path, archive, pin.file))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    logs = []
    t0 = time.monotonic()
    got = pins.fetch(pin, cache=tmp_path / "cache", log=logs.append)
    assert pins.sha256_of(got) == pin.sha256
    assert not any("with pip" in line for line in logs), logs
    assert any("downloaded" in line for line in logs), logs
    assert time.monotonic() - t0 < 60


def test_a_wrong_archive_on_the_index_is_refused(tmp_path, monkeypatch):
    pin = pins.pin_for(DEFAULT)
    bogus = tmp_path / "bogus.tar.gz"
    bogus.write_bytes(b"not the pinned archive")
    monkeypatch.setenv("PIP_INDEX_URL", _local_index(tmp_path, bogus, pin.file))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    with pytest.raises(BuildError, match="sha256 mismatch"):
        pins.fetch(pin, cache=tmp_path / "cache", log=lambda _: None)
    assert not (tmp_path / "cache" / pin.file).exists()


def test_no_index_means_no_direct_download(monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert pins._index_urls() == []


@pytest.mark.slow
def test_an_editable_install_still_works(tmp_path):
    """setup.py's build_py narrows lib/ and adds the pins for wheels only: an editable install
    (whose build_py runs "safely", a failure there once broke `pip install -e .`) maps the
    checkout itself."""
    import os
    import subprocess
    import sys
    import venv
    from pathlib import Path

    from support import skip_without_index
    root = Path(__file__).resolve().parents[2]
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    py = str(tmp_path / "venv" / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "--no-deps", "-e", str(root)],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        skip_without_index(r.stdout + r.stderr, "pip's isolated build environment")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_PY", "PYTHON"))}
    r = subprocess.run([py, "-c", "import ggml_build.pins as p, importlib.util as u; "
                        "print(u.find_spec('ggml_py').origin); print(p.MANIFEST)"],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(root / "ggml_py" / "__init__.py"),
                                str(root / "vendor" / "releases.toml")]
