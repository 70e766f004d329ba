"""The GGUF crash and silent-wrong classes of issue 28, one test (or generator) per class.

Each class has one rule in one place (docs/validation.md, "GGUF and opt classes"):

- byte order: every number written goes through ``_gguf_write._le`` (little-endian);
- narrowing: every value written is converted by ``_gguf_write._numbers``, which refuses a
  conversion that changes it (ints out of range, finite floats that become inf);
- plan first: ``_gguf_write._plan`` checks all metadata before the first C call;
- liveness: tensors are read for writing through the tensor layer (``_transfer.blocking_get``);
- one temporary file per call (``_gguf_write._temporary``), renamed over the path;
- regular files only (``gguf._open_regular``);
- no file mapping unless asked: the header is read with pread, tensors are copied by default;
- a GGUFFile's handle and file are used under its lock (``GGUFFile._lock``);
- load uses the target's default buffer type (``_gguf_load._buffer_type``).

Cases that used to kill or hang the process run in a child process.
"""
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ggml_py as gg
from support import child_env
from ggml_py import gguf

ROOT = Path(__file__).resolve().parents[2]

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python (this checkout's ggml_py); a hang becomes rc None."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                              env=child_env(GGML_NO_BACKTRACE="1"), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, None, str(e.stdout), "timed out")


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


# -- byte order: numbers are written little-endian whatever the array's byte order ---------------

_NUMERIC = ["u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "f32", "f64"]
_NP = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16, "i16": np.int16, "u32": np.uint32,
       "i32": np.int32, "u64": np.uint64, "i64": np.int64, "f32": np.float32, "f64": np.float64}


@st.composite
def _array(draw, kinds=tuple(_NUMERIC)):
    kind = draw(st.sampled_from(kinds))
    dt = np.dtype(_NP[kind])
    n = draw(st.integers(1, 6))
    if dt.kind == "f":
        vals = draw(st.lists(st.floats(-1e30, 1e30, allow_subnormal=False), min_size=n, max_size=n))
    else:
        info = np.iinfo(dt)
        vals = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n))
    a = np.array(vals, dt)
    order = draw(st.sampled_from("<>=|"))
    return kind, a.astype(dt.newbyteorder(order)) if order != "|" else a


@SETTINGS
@given(_array(), st.sampled_from(["array", "scalar", "typed", "tensor"]))
def test_numbers_round_trip_whatever_their_byte_order(tmp_path, case, how):
    kind, a = case
    p = tmp_path / "b.gguf"
    if how == "tensor":
        if kind in ("u8", "u16", "u32", "u64"):
            return                                  # no unsigned ggml types
        gguf.write(p, {}, {"t": a})
        with gguf.read(p) as f, gg.device("CPU").backend(n_threads=1) as be:
            got = f.load(be)["t"].numpy(copy=True)
    else:
        meta = {"k": a if how != "scalar" else a[0]}
        gguf.write(p, meta, types={"k": f"arr[{kind}]"} if how == "typed" else None)
        with gguf.read(p) as f:
            got = f.metadata["k"]
            assert f.metadata_types["k"] == (kind if how == "scalar" else f"arr[{kind}]")
    want = a.astype(a.dtype.newbyteorder("="))
    np.testing.assert_array_equal(np.asarray(got).reshape(-1), want[:1] if how == "scalar" else want)


# -- narrowing: a value that the GGUF type cannot hold is refused, never written as inf ----------

_BIG = st.one_of(st.floats(3.5e38, 1.7e308), st.floats(-1.7e308, -3.5e38))


@SETTINGS
@given(_BIG, st.sampled_from(["scalar", "list", "array", "in list"]))
def test_floats_beyond_f32_are_refused_when_f32_is_asked(tmp_path, x, form):
    v = {"scalar": x, "list": [x], "array": np.array([x]), "in list": [1.0, x, 2.0]}[form]
    spec = "f32" if form == "scalar" else "arr[f32]"
    with pytest.raises(gg.errors.InvalidArgument, match="beyond f32"):
        gguf.write(tmp_path / "f.gguf", {"k": v}, types={"k": spec})
    assert not list(tmp_path.iterdir())


@SETTINGS
@given(_BIG, st.sampled_from(["scalar", "list"]))
def test_inferred_floats_widen_to_f64_like_ints_widen(tmp_path, x, form):
    v = x if form == "scalar" else [0.5, x]
    p = tmp_path / "f.gguf"
    gguf.write(p, {"k": v, "small": 0.5})
    with gguf.read(p) as f:
        assert f.metadata_types["k"] == ("f64" if form == "scalar" else "arr[f64]")
        assert f.metadata_types["small"] == "f32"
        np.testing.assert_array_equal(f.metadata["k"], v)


def test_infinities_and_nan_are_kept_as_given(tmp_path):
    p = tmp_path / "f.gguf"
    gguf.write(p, {"a": [np.inf, -np.inf, np.nan], "b": float("inf")},
               types={"a": "arr[f32]", "b": "f32"})
    with gguf.read(p) as f:
        a = f.metadata["a"]
        assert a[0] == np.inf and a[1] == -np.inf and np.isnan(a[2]) and f.metadata["b"] == np.inf


# -- plan first: every metadata value is checked before ggml is called -------------------------

@pytest.mark.parametrize("value, types", [
    (2**32, None), (2**33, None), (2**64, None), (-32, None), (0, None), (48, None),
    (1.5, None), (True, None), ("32", None), (np.uint64(2**32), None), (np.int64(-1), None),
    (64, {"general.alignment": "u64"}), (64, {"general.alignment": "arr[u32]"}),
])
def test_bad_alignment_raises_before_any_c_call(tmp_path, value, types):
    with pytest.raises(gg.errors.InvalidArgument, match="general.alignment"):
        gguf.write(tmp_path / "a.gguf", {"general.alignment": value}, types=types)
    assert not list(tmp_path.iterdir())


def test_a_late_bad_value_writes_nothing(tmp_path):
    with pytest.raises(gg.errors.InvalidType):
        gguf.write(tmp_path / "a.gguf", {"general.alignment": 64, "ok": 1, "bad": object()})
    assert not list(tmp_path.iterdir())


# -- liveness: a tensor of a dead RPC server raises -------------------------------------------

def test_writing_a_tensor_of_a_dead_rpc_server_raises():
    out = _ok(_child("""
        import sys, os, tempfile, numpy as np, ggml_py as gg
        srv = gg.rpc.serve(); (dev,) = gg.rpc.connect(srv.endpoint).devices
        ctx = gg.Context(); t = ctx.tensor(gg.f32, (4, 8)); ctx.alloc(dev.backend())
        t.set(np.ones((4, 8), np.float32))
        d = tempfile.mkdtemp(); p = os.path.join(d, "r.gguf")
        gg.gguf.write(p, {}, {"t": t}); assert gg.gguf.read(p).tensors[0].nbytes == 128
        os.remove(p)
        srv.kill()
        try:
            gg.gguf.write(p, {}, {"t": t})
        except ConnectionError as e:
            print("raised", "gone" in str(e), sorted(os.listdir(d)))
    """))
    assert "raised True []" in out


# -- one temporary file per call: concurrent writers never tear the file ----------------------

def test_two_writers_of_one_path_leave_one_whole_file(tmp_path):
    p = tmp_path / "w.gguf"
    payloads = {i: np.full(1 << 16, i, np.float32) for i in range(4)}
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            for _ in range(12):
                gguf.write(p, {"who": i}, {"t": payloads[i]})
        except BaseException as e:        # a collision shows as an error or a torn file
            errors.append(e)

    for _ in range(3):
        threads = [threading.Thread(target=writer, args=(i,)) for i in payloads]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        with gguf.read(p) as f, gg.device("CPU").backend(n_threads=1) as be:
            who = f.metadata["who"]
            np.testing.assert_array_equal(f.load(be)["t"].numpy(), payloads[who])
    assert sorted(os.listdir(tmp_path)) == ["w.gguf"]


# -- regular files only -----------------------------------------------------------------------

def test_reading_a_fifo_or_a_directory_raises_instead_of_hanging(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    out = _ok(_child("""
        import sys, ggml_py as gg
        for p in sys.argv[1:]:
            try:
                gg.gguf.read(p)
            except gg.gguf.GGUFError as e:
                print("refused", "not a regular file" in str(e))
            except IsADirectoryError:
                print("refused", "True")
    """, str(fifo), str(tmp_path), "/dev/null", timeout=30))
    assert out.split() == ["refused", "True"] * 3


# -- no file mapping unless asked: a file changed under its readers never kills ---------------

def test_a_loaded_file_overwritten_in_place_keeps_the_loaded_values(tmp_path):
    p = tmp_path / "m.gguf"
    out = _ok(_child("""
        import sys, numpy as np, ggml_py as gg
        p = sys.argv[1]
        a = np.arange(1 << 16, dtype=np.float32)
        gg.gguf.write(p, {"general.architecture": "t"}, {"a": a, "b": a + 1})
        be = gg.device("CPU").backend(n_threads=1)
        f = gg.gguf.read(p)
        ts = f.load(be)
        with open(p, "wb") as fh:       # truncated, then rewritten shorter, in place
            fh.write(b"GGUF" + bytes(100))
        print("same", bool((ts["a"].numpy() == a).all() and (ts["b"].numpy() == a + 1).all()))
        try:
            f.load(be)
        except gg.GGMLError as e:
            print("refused", type(e).__name__)
        f.close()
    """, str(p)))
    assert "same True" in out and "refused" in out


def test_a_file_truncated_while_loading_raises(tmp_path):
    p = tmp_path / "m.gguf"
    out = _ok(_child("""
        import sys, os, numpy as np, ggml_py as gg
        from ggml_py import _gguf_load
        p = sys.argv[1]
        gg.gguf.write(p, {}, {"a": np.ones(1 << 18, np.float32), "b": np.ones(1 << 18, np.float32)})
        _gguf_load.CHUNK = 1 << 16
        f = gg.gguf.read(p)
        def cut(done, total):
            if done == 1 << 16:
                os.truncate(p, 4096)
                # the size check before each chunk passes, as when the file is cut between
                # that check and the read: the read itself must not fault
                f._unchanged = lambda: f._file
        try:
            f.load(gg.device("CPU").backend(n_threads=1), progress=cut)
        except gg.GGMLError as e:
            print("refused", "changed" in str(e))
    """, str(p)))
    assert "refused True" in out


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(24, 3000))
def test_a_header_read_in_pieces_reads_as_a_whole(tmp_path_factory, monkeypatch, head):
    """The header is read with pread in growing pieces: every first piece size, whatever
    field it cuts, gives what one read of the whole file gives."""
    p = tmp_path_factory.getbasetemp() / "pieces.gguf"
    if not p.exists():
        gguf.write(p, {"general.name": "pieces", "tokens": [f"t{i}" * (i % 7) for i in range(300)],
                       "ids": np.arange(500, dtype=np.int64), "f": 0.25},
                   {"a": np.ones((3, 40), np.float32), "b": np.arange(7, dtype=np.int32)})
    with gguf.read(p) as f:
        whole = (dict(f.metadata), f.metadata_types, f.tensors, f.data_offset)
    monkeypatch.setattr(gguf, "HEAD", head)
    with gguf.read(p) as f:
        got = (dict(f.metadata), f.metadata_types, f.tensors, f.data_offset)
    assert got[1:] == whole[1:]
    assert got[0].keys() == whole[0].keys()
    for k in whole[0]:
        np.testing.assert_array_equal(got[0][k], whole[0][k])


def test_a_header_cut_just_before_the_data_section(tmp_path, monkeypatch):
    """A first piece that ends between the tensor infos and the padded data section: ggml
    seeks to the data section, so the piece is completed to it."""
    p = tmp_path / "pad.gguf"
    gguf.write(p, {"general.alignment": 256, "k": "v"}, {"a": np.ones(5, np.float32)})
    with gguf.read(p) as f:
        start = f.data_offset
    for head in range(start - 255, start + 1):
        monkeypatch.setattr(gguf, "HEAD", head)
        with gguf.read(p) as f:
            assert f.data_offset == start and f.metadata["k"] == "v"


def test_zero_copy_is_asked_for(tmp_path):
    """Copy by default; ``copy=False`` still maps the file (its contract: keep it unchanged)."""
    p = tmp_path / "m.gguf"
    gguf.write(p, {}, {"a": np.ones((64, 64), np.float32)})
    with gguf.read(p) as f, gg.device("CPU").backend(n_threads=1) as be:
        assert f.load(be)["a"].buffer.name != "CPU_Mapped"
        assert f.load(be, copy=False)["a"].buffer.name == "CPU_Mapped"
        with pytest.raises(gg.errors.InvalidType, match="copy"):
            f.load(be, copy="no")


# -- a GGUFFile's handle is used under its lock --------------------------------------------------

def test_closing_while_another_thread_reads_metadata(tmp_path):
    p = tmp_path / "v.gguf"
    out = _ok(_child("""
        import sys, threading, ggml_py as gg
        p = sys.argv[1]
        gg.gguf.write(p, {"tokens": [f"tok{i}" for i in range(20000)],
                          "ids": list(range(5000))})
        outcomes = set()
        for _ in range(40):
            f = gg.gguf.read(p)
            def reader():
                try:
                    for k in ("tokens", "ids"):
                        v = f.metadata[k]
                        assert len(v) in (20000, 5000)
                    outcomes.add("read")
                except gg.errors.ClosedError:
                    outcomes.add("closed")
            t = threading.Thread(target=reader); t.start(); f.close(); t.join()
        print("survived", sorted(outcomes))
    """, str(p)))
    assert "survived" in out


# -- load uses the target's default buffer type -------------------------------------------------

def test_load_never_picks_an_extra_buffer_type(tmp_path):
    p = tmp_path / "q.gguf"
    q = np.zeros(34 * 8 * 4, np.uint8)            # q4_0-sized rows: what CPU_REPACK takes
    gguf.write(p, {}, {"w": np.ones((8, 64), np.float32), "q": ("q8_0", (8, 128), q)})
    cpu = gg.device("CPU")
    default = cpu.buffer_type.name
    extra = [b.name for b in cpu.buffer_types if b not in (cpu.buffer_type, cpu.host_buffer_type)]
    with gguf.read(p) as f, cpu.backend(n_threads=1) as be:
        for target in (be, cpu, cpu.buffer_type):
            for copy in (True, False):
                for t in f.load(target, copy=copy).values():
                    assert t.buffer.buffer_type.name in (default, "CPU_Mapped"), (target, extra)


def test_an_explicit_repack_target_raises_or_round_trips(tmp_path):
    out = _ok(_child("""
        import sys, numpy as np, ggml_py as gg
        d = sys.argv[1]
        cpu = gg.device("CPU")
        repack = [b for b in cpu.buffer_types if b not in (cpu.buffer_type, cpu.host_buffer_type)]
        q = np.random.default_rng(0).integers(0, 255, 18 * 2 * 8, dtype=np.uint8)
        w = np.arange(8 * 64, dtype=np.float32).reshape(8, 64)
        gg.gguf.write(d + "/r.gguf", {}, {"q": ("q4_0", (8, 64), q), "w": w})
        for buft in repack:
            for name in ("q", "w"):
                try:
                    with gg.gguf.read(d + "/r.gguf") as f:
                        t = f.load(buft, names=[name])[name]
                    gg.gguf.write(d + "/back.gguf", {}, {name: t})
                    with gg.gguf.read(d + "/back.gguf") as b, gg.gguf.read(d + "/r.gguf") as a:
                        ib, ia = b.tensors[0], [i for i in a.tensors if i.name == name][0]
                    raw = lambda p, i: open(p, "rb").read()[i.offset:i.offset + i.nbytes]
                    print(name, "round trip", raw(d + "/back.gguf", ib) == raw(d + "/r.gguf", ia))
                except gg.GGMLError as e:
                    print(name, "raised", type(e).__name__)
        print("alive")
    """, str(tmp_path)))
    assert "alive" in out and "round trip False" not in out, out
