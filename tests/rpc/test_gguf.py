"""gg.gguf: reading real files (the vocab GGUF files of a pinned llama.cpp sdist, the default release's)
against upstream's gguf-py, writing files gguf-py reads identically, loading tensors (zero copy
on the CPU, chunked uploads elsewhere), and bad files that raise instead of crashing."""
import gc
import json
import os
import re
import struct
import subprocess
import sys
import tarfile
import weakref
from pathlib import Path

import numpy as np
import pytest

import ggml_py as gg
from support import vocab_archive
from ggml_py import gguf
from ggml_py.gguf import GGUFError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = Path(gg.__file__).resolve().parent.parent   # where the children import ggml_py
SMALL = ["ggml-vocab-bert-bge.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"]

# upstream's gguf-py value types by our names
_PY_NAMES = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
             8: "str", 10: "u64", 11: "i64", 12: "f64"}
_NP = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16, "i16": np.int16, "u32": np.uint32,
       "i32": np.int32, "f32": np.float32, "bool": np.bool_, "u64": np.uint64, "i64": np.int64,
       "f64": np.float64}


# -- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def vocab_dir(tmp_path_factory):
    """The ggml-vocab-*.gguf files of a pinned llama.cpp sdist (the default release's),
    extracted once."""
    from ggml_build import pins
    archive = vocab_archive()
    if archive is None:
        pytest.skip(f"no pinned llama.cpp sdist in {pins.cache_dir()} (python build_ggml.py "
                    "downloads the default's): no real GGUF files")
    out = tmp_path_factory.mktemp("vocab")
    with tarfile.open(archive, "r|gz") as tar:
        for m in tar:
            name = m.name.rsplit("/", 1)[-1]
            if m.isfile() and "/models/ggml-vocab-" in m.name and name.endswith(".gguf"):
                with tar.extractfile(m) as src:
                    (out / name).write_bytes(src.read())
    assert len(list(out.glob("*.gguf"))) >= 19
    return out


@pytest.fixture
def cpu_backend():
    with gg.device("CPU").backend(n_threads=1) as be:
        yield be


def gguf_py(path):
    """What upstream's gguf-py reads: version, alignment, metadata, types, tensor infos."""
    reader_mod = pytest.importorskip("gguf")
    r = reader_mod.GGUFReader(path)
    meta, types = {}, {}
    for name, fld in r.fields.items():
        if name.startswith("GGUF."):
            continue
        t = int(fld.types[0])
        if t == 9:
            # parts: key length, key, type, element type, count, elements...; `types` lacks
            # the element type of an empty array
            sub = _PY_NAMES[int(fld.parts[3][0])]
            types[name] = f"arr[{sub}]"
            if sub == "str":
                meta[name] = [bytes(fld.parts[i]).decode("utf-8", "surrogateescape") for i in fld.data]
            else:
                meta[name] = np.concatenate([fld.parts[i] for i in fld.data]) if fld.data else \
                    np.empty(0, _NP[sub])
        else:
            types[name] = _PY_NAMES[t]
            meta[name] = bytes(fld.parts[-1]).decode("utf-8", "surrogateescape") if t == 8 \
                else fld.parts[-1][0]
    tensors = [(t.name, tuple(int(x) for x in reversed(t.shape.tolist())), t.tensor_type.name.lower(),
                int(t.data_offset), int(t.n_bytes)) for t in r.tensors]
    return int(r.fields["GGUF.version"].parts[-1][0]), int(r.alignment), meta, types, tensors


def same_value(a, b, typ: str) -> bool:
    et = typ[4:-1] if typ.startswith("arr[") else typ
    if et == "str":
        return list(a) == list(b) if typ.startswith("arr[") else a == b
    dt = _NP[et]
    return np.asarray(a, dt).tobytes() == np.asarray(b, dt).tobytes()


def assert_same_as_gguf_py(path):
    version, alignment, meta, types, tensors = gguf_py(path)
    with gguf.read(path) as f:
        assert (f.version, f.alignment) == (version, alignment)
        assert list(f.metadata) == list(meta)            # same keys, same order
        assert f.metadata_types == types
        for k in meta:
            assert same_value(f.metadata[k], meta[k], types[k]), k
        assert [(t.name, t.shape, t.type, t.offset, t.nbytes) for t in f.tensors] == tensors


# -- real files ---------------------------------------------------------------------------------

def test_every_vocab_file_reads(vocab_dir):
    for path in sorted(vocab_dir.glob("*.gguf")):
        with gguf.read(path) as f:
            assert f.version in (2, 3) and f.alignment == 32 and f.tensors == []
            assert f.metadata_types["tokenizer.ggml.tokens"] == "arr[str]"
            assert isinstance(f.metadata["general.architecture"], str)
            assert str(path) in repr(f)


@pytest.mark.parametrize("name", SMALL[:1])
def test_vocab_file_same_as_gguf_py(vocab_dir, name):
    assert_same_as_gguf_py(vocab_dir / name)


@pytest.mark.slow
def test_every_vocab_file_same_as_gguf_py(vocab_dir):
    # gguf-py takes seconds per vocabulary (one numpy view per token): about a minute in all
    for path in sorted(vocab_dir.glob("*.gguf")):
        assert_same_as_gguf_py(path)


@pytest.mark.parametrize("name", SMALL)
def test_vocab_file_rewritten_by_ggml_byte_for_byte(vocab_dir, tmp_path, name):
    """ggml's writer, given the values and types read, reproduces the file (plus the padding
    of its metadata to the alignment, which llama.cpp's converter leaves out)."""
    src = vocab_dir / name
    with gguf.read(src) as f:
        gguf.write(tmp_path / name, dict(f.metadata), types=f.metadata_types)
    a, b = src.read_bytes(), (tmp_path / name).read_bytes()
    assert b[:len(a)] == a and set(b[len(a):]) <= {0} and len(b) % 32 == 0


def test_metadata_lazy_arrays_and_close(vocab_dir):
    f = gguf.read(vocab_dir / "ggml-vocab-bert-bge.gguf")
    assert "not read yet" in repr(f.metadata)
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 30522
    assert f["tokenizer.ggml.tokens"][101] == "[CLS]"
    f.close()
    f.close()                                    # idempotent
    assert "closed" in repr(f)
    assert f.metadata["tokenizer.ggml.tokens"][102] == "[SEP]"   # read before closing: kept
    with pytest.raises(gg.ClosedError, match="token_type.*not read before"):
        f.metadata["tokenizer.ggml.token_type"]
    with pytest.raises(gg.ClosedError):
        f.load(gg.device("CPU"))
    with pytest.raises(gg.ClosedError):
        with f:
            pass


# -- writing and reading with gguf-py ---------------------------------------------------------

QF = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
SAMPLE_TYPES = {"t.f32": "f32", "t.f16": "f16", "t.i8": "i8", "t.i32": "i32", "t.f64": "f64",
                "t.q8_0": "q8_0"}


def _sample(rng):
    q, _ = gg.quantize(QF, "q8_0")
    return {
        "t.f32": rng.standard_normal((3, 8)).astype(np.float32),
        "t.f16": rng.standard_normal((2, 3, 4)).astype(np.float16),
        "t.i8": np.arange(-8, 8, dtype=np.int8).reshape(4, 4),
        "t.i32": np.arange(7, dtype=np.int32),
        "t.f64": rng.standard_normal((2, 2, 2, 2)),
        "t.q8_0": ("q8_0", (4, 64), q),
    }


METADATA = {
    "general.architecture": "test", "general.alignment": 64,
    "k.u8": np.uint8(200), "k.i8": np.int8(-100), "k.u16": np.uint16(60000),
    "k.i16": np.int16(-30000), "k.u32": np.uint32(4_000_000_000), "k.i32": -5,
    "k.f32": 0.5, "k.bool": True, "k.str": "héllo", "k.u64": np.uint64(2**64 - 1),
    "k.i64": -2**40, "k.f64": np.float64(1 / 3),
    "a.u8": np.arange(5, dtype=np.uint8), "a.i64": [1, -2**40], "a.f32": [0.5, 1.5],
    "a.bool": [True, False], "a.str": ["x", "", "zz"], "a.empty": [],
    "a.f64": np.array([1e300, -0.0]), "a.u16": np.array([1, 65535], np.uint16),
}
TYPES = {"k.u8": "u8", "k.i8": "i8", "k.u16": "u16", "k.i16": "i16", "k.u32": "u32", "k.i32": "i32",
         "k.f32": "f32", "k.bool": "bool", "k.str": "str", "k.u64": "u64", "k.i64": "i64",
         "k.f64": "f64", "a.u8": "arr[u8]", "a.i64": "arr[i64]", "a.f32": "arr[f32]",
         "a.bool": "arr[bool]", "a.str": "arr[str]", "a.empty": "arr[str]", "a.f64": "arr[f64]",
         "a.u16": "arr[u16]", "general.architecture": "str", "general.alignment": "u32"}


def test_write_types_inferred_and_read_back(tmp_path, rng):
    p = tmp_path / "w.gguf"
    tensors = _sample(rng)
    gguf.write(p, METADATA, tensors)
    with gguf.read(p) as f:
        assert f.metadata_types == {k: TYPES[k] for k in METADATA}
        for k, v in METADATA.items():
            assert same_value(f.metadata[k], v, TYPES[k]), k
        assert f.alignment == 64 and f.version == 3
        assert all(t.offset % 64 == 0 for t in f.tensors)
        assert {t.name: t.type for t in f.tensors} == SAMPLE_TYPES
        assert [t.shape for t in f.tensors] == [v[1] if isinstance(v, tuple) else v.shape
                                                for v in tensors.values()]


def test_written_file_same_in_gguf_py(tmp_path, rng):
    p = tmp_path / "w.gguf"
    tensors = _sample(rng)
    gguf.write(p, METADATA, tensors)
    assert_same_as_gguf_py(p)
    r = pytest.importorskip("gguf").GGUFReader(p)
    for t in r.tensors:
        v = tensors[t.name]
        want = v[2] if isinstance(v, tuple) else v
        assert np.asarray(t.data).tobytes() == np.asarray(want).tobytes(), t.name


def test_gguf_py_file_read_the_same(tmp_path, rng):
    gp = pytest.importorskip("gguf")
    T = gp.GGUFValueType
    p = tmp_path / "gp.gguf"
    w = gp.GGUFWriter(p, arch="testarch")
    w.add_custom_alignment(64)
    for key, val, vt in [("k.u8", 200, T.UINT8), ("k.i8", -3, T.INT8), ("k.u16", 65535, T.UINT16),
                         ("k.i16", -2, T.INT16), ("k.u32", 2**32 - 1, T.UINT32), ("k.i32", -7, T.INT32),
                         ("k.f32", 1.25, T.FLOAT32), ("k.bool", False, T.BOOL),
                         ("k.str", "a\0b ☃", T.STRING), ("k.u64", 2**63, T.UINT64),
                         ("k.i64", -2**63, T.INT64), ("k.f64", float("nan"), T.FLOAT64)]:
        w.add_key_value(key, val, vt)
    w.add_key_value("a.u16", [1, 2, 3], T.ARRAY, sub_type=T.UINT16)
    w.add_key_value("a.f64", [0.1, -2.0], T.ARRAY, sub_type=T.FLOAT64)
    w.add_array("a.str", ["x", "y\0z", ""])
    w.add_array("a.bool", [True, True, False])
    tensors = _sample(rng)
    for name, v in tensors.items():
        if isinstance(v, tuple):
            w.add_tensor(name, v[2].reshape(4, -1), raw_dtype=gp.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same_as_gguf_py(p)
    with gguf.read(p) as f:
        assert f.metadata["k.str"] == "a\0b ☃"             # past ggml's C string end
        assert f.metadata["a.str"] == ["x", "y\0z", ""]
        assert np.isnan(f.metadata["k.f64"])
        ts = f.load(gg.device("CPU"))
        for name, v in tensors.items():
            if isinstance(v, tuple):   # q8_0: 8-bit steps of each block's largest value
                np.testing.assert_allclose(ts[name].numpy(), QF, atol=np.abs(QF).max() / 100)
            else:
                np.testing.assert_array_equal(ts[name].numpy(), v)
        gguf.write(tmp_path / "again.gguf", {}, ts)        # quantized Tensors: their bytes
    again = {t.name: np.asarray(t.data).tobytes() for t in gp.GGUFReader(tmp_path / "again.gguf").tensors}
    assert again["t.q8_0"] == np.asarray(tensors["t.q8_0"][2]).tobytes()
    assert again["t.f16"] == tensors["t.f16"].tobytes()


# -- loading --------------------------------------------------------------------------------------

def _small_file(tmp_path, name="m.gguf", **kw):
    p = tmp_path / name
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 7
    b = np.arange(6, dtype=np.int32).reshape(2, 3)
    gguf.write(p, {"general.architecture": "t", **kw}, {"a": a, "b": b})
    return p, a, b


def test_load_cpu_zero_copy_lifetime(tmp_path, cpu_backend):
    p, a, b = _small_file(tmp_path)
    f = gguf.read(p)
    ts = f.load(cpu_backend, copy=False)                 # (copies by default)
    assert list(ts) == ["a", "b"] and ts["a"].shape == (64, 64) and ts["b"].type == gg.i32
    assert ts["a"].buffer.name == "CPU_Mapped"          # the file's pages, not a copy
    f.close()                                            # the mapping stays with the tensors
    del f
    gc.collect()
    np.testing.assert_array_equal(ts["a"].numpy(), a)
    np.testing.assert_array_equal(ts["b"].numpy(), b)
    ts["b"].set(np.zeros((2, 3), np.int32))              # copy-on-write: the file is untouched
    with gguf.read(p) as g:
        np.testing.assert_array_equal(g.load(cpu_backend)["b"].numpy(), b)
    ctx = weakref.ref(ts["a"].ctx)
    del ts
    gc.collect()
    assert ctx() is None


def test_two_loads_do_not_share_memory(tmp_path, cpu_backend):
    p, a, b = _small_file(tmp_path)
    with gguf.read(p) as f:
        one, two = f.load(cpu_backend, copy=False), f.load(cpu_backend, copy=False)
    one["b"].set(np.full((2, 3), 7, np.int32))
    np.testing.assert_array_equal(two["b"].numpy(), b)
    assert one["b"].numpy()[0, 0] == 7


def test_file_changed_since_opened(tmp_path, cpu_backend):
    p, _, _ = _small_file(tmp_path)
    with gguf.read(p) as f:
        with open(p, "r+b") as fh:
            fh.truncate(f.size - 64)
        with pytest.raises(gg.GGMLError, match="changed size since it was opened"):
            f.load(cpu_backend)
        with pytest.raises(gg.GGMLError, match="changed size"):
            f.load(gg.device("CPU"), names=["b"])


def test_load_computes(tmp_path, cpu_backend):
    p, a, _ = _small_file(tmp_path)
    with gguf.read(p) as f:
        ts = f.load(cpu_backend)
    out = ts["a"] @ ts["a"]
    cpu_backend.compute(gg.Graph([out]))
    np.testing.assert_allclose(out.numpy(), a @ a, rtol=1e-4)


def test_load_unaligned_copies(tmp_path, cpu_backend):
    p = tmp_path / "u.gguf"
    x = np.arange(3, dtype=np.int8)
    y = np.linspace(0, 1, 5, dtype=np.float32)
    gguf.write(p, {"general.alignment": 1}, {"x": x, "y": y})
    with gguf.read(p) as f:
        assert f.alignment == 1 and f.tensors[1].offset % 4 != 0
        ts = f.load(cpu_backend)
    assert ts["y"].buffer.name != "CPU_Mapped"
    np.testing.assert_array_equal(ts["y"].numpy(), y)
    np.testing.assert_array_equal(ts["x"].numpy(), x)


def test_load_names_and_targets(tmp_path):
    p, a, b = _small_file(tmp_path)
    cpu = gg.device("CPU")
    with gguf.read(p) as f:
        ts = f.load(cpu.buffer_type, names=["b"])
        assert list(ts) == ["b"]
        np.testing.assert_array_equal(ts["b"].numpy(), b)
        with pytest.raises(gg.NotFound, match="no tensor named 'c'"):
            f.load(cpu, names=["b", "c"])
        with pytest.raises(gg.InvalidArgument, match="Backend, Device or BufferType"):
            f.load("CPU")
        assert f.load(cpu, names=[]) == {}
        assert list(f.load(cpu, names=(n for n in ["b", "a", "b"]))) == ["b", "a"]


def test_load_rpc_uploads_in_chunks(tmp_path, rpc_devs, monkeypatch):
    from ggml_py import _gguf_load
    monkeypatch.setattr(_gguf_load, "CHUNK", 4096)
    p, a, b = _small_file(tmp_path)
    seen = []
    with rpc_devs[0].backend() as be, gguf.read(p) as f:
        ts = f.load(be, progress=lambda done, total: seen.append((done, total)))
        assert ts["a"].buffer.name.startswith("RPC")
        np.testing.assert_array_equal(ts["a"].numpy(), a)
        np.testing.assert_array_equal(ts["b"].numpy(), b)
        gguf.write(tmp_path / "back.gguf", {}, ts)     # Tensors read back from the device
        del ts
        gc.collect()
    with gguf.read(tmp_path / "back.gguf") as g:
        back = g.load(gg.device("CPU"))
        np.testing.assert_array_equal(back["a"].numpy(), a)
        np.testing.assert_array_equal(back["b"].numpy(), b)
    total = a.nbytes + b.nbytes
    assert len(seen) == a.nbytes // 4096 + 1 and seen[-1] == (total, total)


def test_html_display(tmp_path):
    p, _, _ = _small_file(tmp_path)
    with gguf.read(p) as f:
        h = f._repr_html_()
    assert "<table" in h and "general.architecture" in h and ">a<" in h and "f32" in h
    assert "closed" in f._repr_html_()


# -- writing: refusals --------------------------------------------------------------------------

@pytest.mark.parametrize("meta, tensors, types, match", [
    ({"k": "a\0b"}, {}, {}, "NUL byte"),
    ({"general.alignment": 48}, {}, {}, "power of 2"),
    ({"general.alignment": 64}, {}, {"general.alignment": "u64"}, "power of 2"),
    ({"k": 300}, {}, {"k": "u8"}, "out of u8's range"),
    ({"k": 1.5}, {}, {"k": "i32"}, "takes integers"),
    ({"k": [[1, 2]]}, {}, {}, "arrays of arrays"),
    ({"k": [1, "a"]}, {}, {}, "mixes types"),
    ({"k": object()}, {}, {}, "cannot store"),
    ({"k": 1}, {}, {"k": "arr[x]"}, "unknown GGUF type"),
    ({"k": 2**64}, {}, {}, "does not fit"),
    ({"": 1}, {}, {}, "non-empty"),
    ({}, [("t", np.ones(2, np.float32)), ("t", np.ones(2, np.float32))], {}, "duplicate tensor"),
    ({}, {"x" * 64: np.ones(2, np.float32)}, {}, "tensor names are 1 to 63 bytes"),
    ({}, {"t": np.ones(2, np.uint16)}, {}, "no ggml type for dtype uint16"),
    ({}, {"t": ("q4_0", (2, 33), np.zeros(40, np.uint8))}, {}, "whole q4_0 blocks"),
    ({}, {"t": ("q8_0", (1, 32), np.zeros(33, np.uint8))}, {}, "33 bytes of data .* takes 34"),
    ({}, {"t": ("nope", (1, 32), np.zeros(34, np.uint8))}, {}, "unknown ggml type"),
    ({}, {"t": np.ones((1, 1, 1, 1, 2), np.float32)}, {}, "1 to 4 axes"),
    ({}, {"t": [1.0, 2.0]}, {}, "expected a numpy array"),
])
def test_write_refuses(tmp_path, meta, tensors, types, match):
    p = tmp_path / "bad.gguf"
    with pytest.raises(gg.GGMLError, match=match):
        gguf.write(p, meta, tensors, types=types)
    assert not p.exists() and list(tmp_path.iterdir()) == []


# -- bad files ----------------------------------------------------------------------------------

def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, t: int, payload: bytes) -> bytes:
    return _s(key.encode()) + struct.pack("<i", t) + payload


def _ti(name: bytes, ne, t: int, off: int) -> bytes:
    return _s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", d) for d in ne) + \
        struct.pack("<iQ", t, off)


def build(kvs=(), tis=(), data=b"", version=3, n_kv=None, n_t=None, magic=b"GGUF", align=32):
    head = magic + struct.pack("<Iqq", version, len(tis) if n_t is None else n_t,
                               len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(tis)
    if tis:
        head += b"\0" * (-len(head) % align)
    return head + data


U32 = lambda k, v: _kv(k, 4, struct.pack("<I", v))  # noqa: E731
F32_4 = _ti(b"w", [4], 0, 0)
GOOD = build([U32("a", 1), _kv("s", 8, _s(b"hi"))], [F32_4, _ti(b"v", [2], 0, 32)], b"\1" * 40)

BAD = [
    (b"", "truncated: 0 bytes"),
    (GOOD[:20], "truncated: 20 bytes"),
    (build(magic=b"GGML"), "not a GGUF file: magic b'GGML'"),
    (build(version=1), "version 1 is no longer supported"),
    (build(version=0x03000000), "big-endian"),
    (build(version=4), "version 4 is newer"),
    (build(n_kv=2**62), "absurd key-value count 4611686018427387904"),
    (build(n_kv=-1), "absurd key-value count -1"),
    (build(n_t=10**12), "absurd tensor count"),
    (build([struct.pack("<Q", 2**63) + b"x" * 20]), "key 0: length 9223372036854775808 exceeds"),
    (build([struct.pack("<Q", 100) + b"x" * 20]), "truncated: key 0 needs 100 bytes"),
    (build([_kv("", 4, b"\0" * 4)]), "key 0 is empty"),
    (build([_kv("a\0b", 4, b"\0" * 4)]), "contains a NUL byte"),
    (build([U32("a", 1), U32("a", 2)]), "duplicate key 'a'"),
    (build([_kv("a", 13, b"\0" * 8)]), "key 'a': invalid value type 13"),
    (build([_kv("a", 9, struct.pack("<iQ", 9, 1) + b"\0" * 16)]), "invalid array element type 9"),
    (build([_kv("a", 9, struct.pack("<iQ", 4, 2**40))]), "1099511627776 elements exceed"),
    (build([_kv("a", 9, struct.pack("<iQ", 4, 1000) + b"\0" * 40)]), "truncated: the value of 'a'"),
    (build([_kv("a", 9, struct.pack("<iQ", 8, 2) + _s(b"ok") + struct.pack("<Q", 99) + b"xx")]),
     "array 'a' runs past the end of the file at string 1 of 2"),
    (build([_kv("general.alignment", 5, struct.pack("<i", 64))]), "must be of type u32, not i32"),
    (build([U32("general.alignment", 48)]), "general.alignment 48 is not a power of 2"),
    (build([U32("general.alignment", 0)]), "general.alignment 0 is not a power of 2"),
    (build(tis=[_ti(b"x" * 64, [4], 0, 0)], data=b"\0" * 16), "name of 64 bytes"),
    (build(tis=[F32_4, F32_4], data=b"\0" * 64), "duplicate tensor name 'w'"),
    (build(tis=[_ti(b"w", [1, 1, 1, 1, 1], 0, 0)], data=b"\0" * 4), "5 dimensions"),
    (build(tis=[_ti(b"w", [4, -1], 0, 0)], data=b"\0" * 16), "negative dimension"),
    (build(tis=[_ti(b"w", [2**40, 2**40], 0, 0)]), "more elements than int64"),
    (build(tis=[_ti(b"w", [4], 99, 0)], data=b"\0" * 16), "unknown ggml type 99"),
    (build(tis=[_ti(b"w", [4], 4, 0)], data=b"\0" * 16), "unknown ggml type 4"),   # Q4_2: removed
    (build(tis=[_ti(b"w", [33], 2, 0)], data=b"\0" * 32), "33 values per row .* q4_0's block size 32"),
    (build(tis=[_ti(b"w", [4], 0, 8)], data=b"\0" * 64), "offset 8, expected 0"),
    (build(tis=[F32_4, _ti(b"v", [2], 0, 16)], data=b"\0" * 64), "offset 16, expected 32"),
    (GOOD[:-1], "truncated: tensor 'v' ends at byte"),
    (build(tis=[F32_4]), "truncated: tensor 'w' ends"),
]


@pytest.mark.parametrize("data, match", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_file_raises(tmp_path, data, match):
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    with pytest.raises(GGUFError, match=re.escape(str(p)) + ": .*" + match):
        gguf.read(p)


def test_damaged_names_are_cut_in_messages(tmp_path):
    p = tmp_path / "long.gguf"
    p.write_bytes(build([_kv("k" * 100_000 + "\0", 4, b"\0" * 4)]))
    with pytest.raises(GGUFError, match=r"key 0 'kkk.*… \(100001 characters\) contains a NUL") as e:
        gguf.read(p)
    assert len(str(e.value)) < 200 + len(str(p))


def test_good_reference_file_reads(tmp_path):
    p = tmp_path / "good.gguf"
    p.write_bytes(GOOD)
    with gguf.read(p) as f:
        assert f.metadata == {"a": 1, "s": "hi"}
        assert [(t.name, t.shape, t.offset) for t in f.tensors] == \
            [("w", (4,), f.data_offset), ("v", (2,), f.data_offset + 32)]


def test_every_truncation_raises(tmp_path):
    p = tmp_path / "t.gguf"
    for n in range(len(GOOD)):
        p.write_bytes(GOOD[:n])
        with pytest.raises(GGUFError, match="truncated|absurd .* count"):
            gguf.read(p)


def test_not_a_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        gguf.read(tmp_path / "missing.gguf")
    with pytest.raises(IsADirectoryError):
        gguf.read(tmp_path)


def test_fuzz_sample(vocab_dir, tmp_path):
    """200 random mutations of real files (and of a file with tensors), in child processes:
    each is read, refused with GGUFError, or the run fails."""
    small = tmp_path / "files"
    small.mkdir()
    for name in SMALL:
        (small / name).symlink_to(vocab_dir / name)
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz_gguf.py"), "--count", "200",
                        "--dir", str(small), "--batch", "100", "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["mutations"] == 200 and not summary["bugs"] and not summary["crashes"]
    assert summary["ours"].get("refused", 0) > 100 and summary["ours"].get("ok", 0) > 0
