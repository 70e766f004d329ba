"""Tests written against survivors of the census of every mutant (docs/mutation.md): the GGUF
reader's parse (ggml's log captured around gguf_init, the user's logger put back after it),
the file-only parse of releases before gguf_init_from_buffer, and the writer's scratch ggml
context. Each fails when its mutant is applied and passes without."""
import gc
import logging

import numpy as np
import pytest

import ggml_py as gg
from ggml_py import _features, gguf
from support import malloc_in_use


@pytest.fixture
def small_gguf(tmp_path):
    """A GGUF file written by ggml_py: two keys and two tensors."""
    path = tmp_path / "small.gguf"
    gg.gguf.write(path, {"general.name": "census", "n": 7},
                  {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                   "b": np.array([1, -2], np.int32)})
    return path


def _ggml_error_line(caplog) -> list[str]:
    """Have ggml log an ERROR line (a 1 PiB CPU buffer: "insufficient memory") and return
    the lines the "ggml" logger received meanwhile."""
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="ggml"):
        with pytest.raises(gg.OutOfMemory):
            gg.device("CPU").buffer_type.alloc(1 << 50)
    return [r.getMessage() for r in caplog.records if r.name == "ggml"]


# -- the parse: ggml's log captured during gguf_init, the user's logger back afterwards --------
def test_reading_a_file_gives_ggmls_log_back_to_the_ggml_logger(small_gguf, caplog):
    """_ggml_parse reads the current log callback (ggml_log_get), installs its capture for the
    parse and restores the callback it read (the second ggml_log_set): after gg.gguf.read,
    ggml's lines still reach logging's "ggml" logger, not ggml's default stderr printer (a
    skipped ggml_log_get restores NULL) nor the capture's stderr fallback (a skipped restore)."""
    assert any("insufficient memory" in m for m in _ggml_error_line(caplog))   # before
    with gg.gguf.read(small_gguf) as f:
        assert f.metadata["general.name"] == "census" and f.metadata["n"] == 7
    lines = _ggml_error_line(caplog)
    assert any("insufficient memory" in m for m in lines), lines


def test_a_refused_parse_returns_ggmls_lines_instead_of_logging_them(caplog, tmp_path):
    """ggml's own error lines of a parse it refuses go into the GGUFError's text (the
    capture of the first ggml_log_set), not to the user's "ggml" logger; and after it the
    logger gets ggml's lines again. (The public read never gets here: its Python walk refuses
    every such file first; the parse step is called as read calls it.)"""
    bad = b"XGUF" + bytes(60)
    path = tmp_path / "bad.gguf"      # (releases before gguf_init_from_buffer read the file)
    path.write_bytes(bad)
    with caplog.at_level(logging.DEBUG, logger="ggml"), open(path, "rb") as f:
        with gg.ffi.from_buffer("void *", bad) as ptr:
            raw, log = gguf._ggml_parse(ptr, len(bad), f.fileno())
    assert raw == gg.ffi.NULL
    assert "invalid magic" in log, log
    leaked = [r.getMessage() for r in caplog.records if r.name == "ggml"]
    assert not any("magic" in m for m in leaked), leaked
    lines = _ggml_error_line(caplog)
    assert any("insufficient memory" in m for m in lines), lines


# -- releases before gguf_init_from_buffer: ggml parses the open file through /dev/fd ----------
@pytest.fixture
def file_only(monkeypatch):
    """The path of a release without gguf_init_from_buffer (0.9.4), on this build's real
    gguf_init_from_file: the feature gate says the buffer parser is absent."""
    monkeypatch.setattr(_features, "GGUF_FROM_BUFFER", False)


def test_a_release_that_parses_files_only_reads_through_dev_fd(small_gguf, file_only):
    """init_from_bytes parses the very file read() opened, through /dev/fd/<fd>."""
    with gg.gguf.read(small_gguf) as f:
        assert f.metadata["general.name"] == "census"
        assert [(t.name, t.shape, t.type) for t in f.tensors] == \
            [("w", (2, 3), "f32"), ("b", (2,), "i32")]
        assert f.metadata_types["n"] == "i32"


def test_a_release_that_parses_files_only_writes_the_alignment_asked(tmp_path, file_only):
    """gg.gguf.write with general.alignment: the writer's gguf context is parsed from a
    one-key header (ggml pads to the alignment such a context carries), through a temporary
    file's /dev/fd where the release has no buffer parser."""
    path = tmp_path / "aligned.gguf"
    gg.gguf.write(path, {"general.alignment": 256}, {"a": np.ones(3, np.float32),
                                                       "b": np.full(5, 2, np.float32)})
    with gg.gguf.read(path) as f:
        assert f.alignment == 256 and f.metadata["general.alignment"] == 256
        assert all(t.offset % 256 == 0 for t in f.tensors), f.tensors
        with gg.device("CPU").backend(n_threads=1) as be:
            got = f.load(be)
            np.testing.assert_array_equal(got["b"].numpy(), np.full(5, 2, np.float32))


# -- the writer's scratch ggml context is freed ------------------------------------------------
@pytest.mark.skipif(malloc_in_use() is None, reason="needs glibc's mallinfo2")
def test_writing_frees_the_ggml_context_of_its_tensor_records(tmp_path):
    """write() lays its tensors out in a no_alloc ggml context of tensor_overhead() * (n + 1)
    bytes, freed (ggml_free) once ggml has placed them: four writes of 1024 tensors must not
    keep their 4 x 377 KB of ggml memory (malloc's bytes in use, measured after a warm-up)."""
    tensors = {f"t{i}": np.zeros(1, np.float32) for i in range(1024)}
    path = tmp_path / "many.gguf"
    gg.gguf.write(path, {}, tensors)             # warm-up: caches, the file's first creation
    gc.collect()
    before = malloc_in_use()
    for _ in range(4):
        gg.gguf.write(path, {}, tensors)
    gc.collect()
    grown = malloc_in_use() - before
    per_write = int(gg.raw.lib.ggml_tensor_overhead()) * (len(tensors) + 1)
    assert grown < per_write, (grown, per_write)
    with gg.gguf.read(path) as f:
        assert len(f.tensors) == 1024
