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
