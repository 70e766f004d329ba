"""Random mutations of real GGUF files, read by gg.gguf.read and by ggml's parser alone, each
batch in a child process so that a crash is caught, attributed to its seed, and the run goes on.

Files: the vocabulary GGUF files of a pinned llama.cpp sdist, the default release's (extracted
from the sdist cache, or --dir), plus one file with tensors written here (the vocab files have none,
and tensor infos are half of the format).

    python benchmarks/fuzz_gguf.py                      # 10,000 mutations, 2 jobs
    python benchmarks/fuzz_gguf.py --count 200 --json   # what the test suite runs
    python benchmarks/fuzz_gguf.py --raw                # also ggml alone (may crash: reported)

Outcomes per mutation: `ok` (still a valid file: read, every value and tensor touched),
`refused` (GGUFError, grouped by reason), `bug` (any other exception) or `crash` (the child
died). With --raw, ggml's gguf_init_from_buffer (no_alloc, with a ggml context for the
tensors) and gguf_init_from_file (no_alloc=false, under a 4 GiB address-space limit) run on the
same bytes, and their verdicts are compared with ours. Exit status 1 when gg.gguf.read
crashed or raised anything but GGUFError.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTERESTING = [0, 1, 2, 3, 7, 8, 9, 12, 13, 31, 32, 33, 63, 64, 255, 256, 4095, 4096, 65535,
               2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


# -- inputs -----------------------------------------------------------------------------------

def extract_vocab(dest: Path) -> list[Path]:
    """The ggml-vocab-*.gguf files of the pinned sdist, extracted under `dest`."""
    sys.path.insert(0, str(ROOT))
    from ggml_build import pins
    archive = pins.vocab_sdist()
    if archive is None:
        raise FileNotFoundError(f"no pinned llama.cpp sdist in {pins.cache_dir()}: run "
                                "`python build_ggml.py` (it downloads the default's)")
    out = []
    with tarfile.open(archive, "r|gz") as tar:
        for m in tar:
            name = m.name.rsplit("/", 1)[-1]
            if m.isfile() and "/models/ggml-vocab-" in m.name and name.endswith(".gguf"):
                target = dest / name
                with tar.extractfile(m) as src, open(target, "wb") as dst:
                    dst.write(src.read())
                out.append(target)
    return sorted(out)


def tensor_file(dest: Path) -> Path:
    """A small GGUF file with tensors of several types (and some metadata of each kind)."""
    import numpy as np
    if "ggml_py" not in sys.modules and str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))   # run from a checkout without installing
    import ggml_py as gg
    import ggml_py.gguf  # noqa: F401  (gg.gguf)
    rng = np.random.default_rng(0)
    q, _ = gg.quantize(rng.standard_normal((4, 64)).astype(np.float32), "q8_0")
    path = dest / "tensors.gguf"
    gg.gguf.write(path, {
        "general.architecture": "fuzz", "general.alignment": 32, "n.u8": np.uint8(7),
        "n.i64": np.int64(-5), "n.f64": 0.25, "flag": True, "ids": np.arange(40, dtype=np.int32),
        "words": ["a", "bc", "def"], "bits": [True, False, True]}, {
        "w.f32": rng.standard_normal((3, 8)).astype(np.float32),
        "w.f16": rng.standard_normal((2, 2, 4)).astype(np.float16),
        "w.i8": np.arange(16, dtype=np.int8).reshape(4, 4),
        "w.i32": np.arange(5, dtype=np.int32),
        "w.q8_0": ("q8_0", (4, 64), q),
        "w.f64": np.ones((1, 2), np.float64)})
    return path


# -- mutations --------------------------------------------------------------------------------

def _pos(rng: random.Random, n: int) -> int:
    # half of the hits in the first 4 KiB: magic, counts, the first keys and their types
    return rng.randrange(min(n, 4096)) if rng.random() < 0.5 else rng.randrange(n)


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One random mutation of `data`; returns (bytes, a short description)."""
    b = bytearray(data)
    n = len(b)
    kind = rng.choice(["flip", "flip", "int", "int", "truncate", "delete", "insert", "duplicate",
                       "header"])
    if kind == "flip":
        k = rng.randint(1, 8)
        for _ in range(k):
            b[_pos(rng, n)] = rng.randrange(256)
        return bytes(b), f"flip {k} bytes"
    if kind == "int":
        width = rng.choice([4, 8])
        p = _pos(rng, n - width)
        v = rng.choice(INTERESTING + [n, n + 1, rng.getrandbits(width * 8)]) % (1 << (width * 8))
        b[p:p + width] = v.to_bytes(width, "little")
        return bytes(b), f"int{width * 8} {v} at {p}"
    if kind == "truncate":
        k = _pos(rng, n)
        return bytes(b[:k]), f"truncate to {k}"
    if kind == "delete":
        p = _pos(rng, n)
        k = rng.randint(1, 64)
        del b[p:p + k]
        return bytes(b), f"delete {k} at {p}"
    if kind == "insert":
        p = _pos(rng, n)
        k = rng.randint(1, 64)
        b[p:p] = bytes(rng.randrange(256) for _ in range(k))
        return bytes(b), f"insert {k} at {p}"
    if kind == "duplicate":
        p = _pos(rng, n)
        k = rng.randint(1, 256)
        b[p:p] = b[p:p + k]
        return bytes(b), f"duplicate {k} at {p}"
    field = rng.choice([(0, 4), (4, 4), (8, 8), (16, 8)])   # magic, version, n_tensors, n_kv
    v = rng.choice(INTERESTING + [rng.getrandbits(field[1] * 8)]) % (1 << (field[1] * 8))
    b[field[0]:field[0] + field[1]] = v.to_bytes(field[1], "little")
    return bytes(b), f"header field at {field[0]} = {v}"


def reason(msg: str) -> str:
    """An error message with its numbers and names taken out, to group refusals."""
    msg = msg.split(": ", 1)[-1]
    quoted = r"b?['\"][^\n]*?… \(\d+ characters\)|b?'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
    msg = re.sub(quoted, "'…'", msg)
    return re.sub(r"\b0x[0-9a-f]+\b|\b\d+\b", "N", msg)[:110]


# -- the child ----------------------------------------------------------------------------------

def child(files: list[str], first: int, last: int, raw: bool, tmp: str) -> None:
    """Run seeds [first, last); one line per stage, so the parent can tell where a crash was."""
    import numpy as np
    import ggml_py as gg
    import ggml_py.gguf  # noqa: F401  (gg.gguf)
    from ggml_py.gguf import GGUFError
    from ggml_py._loader import ffi, lib
    if raw:
        import resource
        lim = 4 << 30
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        logs: list[str] = []

        @ffi.callback("void(enum ggml_log_level, const char *, void *)")
        def quiet(level, text, ud):
            logs.append(ffi.string(text).decode("utf-8", "replace"))
        lib.ggml_log_set(quiet, ffi.NULL)
    cpu = gg.device("CPU")
    originals = {f: Path(f).read_bytes() for f in files}
    path = os.path.join(tmp, f"m{os.getpid()}.gguf")

    def emit(**kw):
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()

    for seed in range(first, last):
        rng = random.Random(seed)
        src = rng.choice(files)
        data, what = mutate(originals[src], rng)
        with open(path, "wb") as fh:
            fh.write(data)
        emit(stage="read", seed=seed, ours=None)
        try:
            with gg.gguf.read(path) as f:
                dict(f.metadata)
                if f.tensors:
                    for t in f.load(cpu).values():
                        np.asarray(t.numpy())
            ours = "ok"
        except GGUFError as e:
            ours = "refused: " + reason(str(e))
        except gg.GGMLError as e:
            ours = "refused (other GGMLError): " + reason(str(e))
        except Exception as e:  # noqa: BLE001 - what the run is looking for
            ours = f"bug: {type(e).__name__}: {e}"
        ggml_buf = ggml_file = None
        if raw:
            emit(stage="raw", seed=seed, ours=ours)
            logs.clear()
            pctx = ffi.new("struct ggml_context **")
            params = ffi.new("struct gguf_init_params *", {"no_alloc": True, "ctx": pctx})
            g = lib.gguf_init_from_buffer(ffi.from_buffer(data), len(data), params[0]) if data else ffi.NULL
            ggml_buf = "ok" if g != ffi.NULL else "null: " + reason(logs[-2] if len(logs) > 1 else "".join(logs))
            if g != ffi.NULL:
                lib.gguf_free(g)
                lib.ggml_free(pctx[0])
            emit(stage="raw-alloc", seed=seed, ours=ours, ggml=ggml_buf)
            logs.clear()
            params = ffi.new("struct gguf_init_params *", {"no_alloc": False, "ctx": pctx})
            g = lib.gguf_init_from_file(path.encode(), params[0])
            ggml_file = "ok" if g != ffi.NULL else "null"
            if g != ffi.NULL:
                lib.gguf_free(g)
                lib.ggml_free(pctx[0])
        emit(stage="done", seed=seed, file=Path(src).name, mutation=what, ours=ours,
             ggml=ggml_buf, ggml_alloc=ggml_file)
    os.remove(path) if os.path.exists(path) else None


# -- the parent ---------------------------------------------------------------------------------

def run_batches(files, seeds: range, batch: int, jobs: int, raw: bool, tmp: str):
    """Yield one record per seed; a child that dies is restarted after the seed it died on."""
    import ggml_py   # the children import the same package, wherever it lives
    where = str(Path(ggml_py.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=where + os.pathsep + os.environ.get("PYTHONPATH", ""),
               GGML_NO_BACKTRACE="1")
    todo = [(s, min(s + batch, seeds.stop)) for s in range(seeds.start, seeds.stop, batch)]
    running: list = []
    while todo or running:
        while todo and len(running) < jobs:
            a, b = todo.pop(0)
            cmd = [sys.executable, __file__, "--child", str(a), str(b), "--tmp", tmp,
                   *(["--raw"] if raw else []), "--files", *map(str, files)]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            running.append((p, a, b))
        p, a, b = running.pop(0)
        out, err = p.communicate()
        last = None
        for line in out.splitlines():
            rec = json.loads(line)
            if rec["stage"] == "done":
                last = None
                yield rec
            else:
                last = rec
        if p.returncode != 0:
            if last is None:    # died outside a seed (start-up): report and stop
                raise RuntimeError(f"child {a}..{b} failed: {err[-2000:]}")
            s = last["seed"]
            rng = random.Random(s)
            src = rng.choice(files)
            _, what = mutate(Path(src).read_bytes(), rng)
            yield {"stage": "done", "seed": s, "file": Path(src).name, "mutation": what,
                   "ours": "crash" if last["stage"] == "read" else last["ours"],
                   "ggml": "crash" if last["stage"] == "raw" else last.get("ggml"),
                   "ggml_alloc": "crash" if last["stage"] == "raw-alloc" else None,
                   "signal": -p.returncode, "stderr": err.strip().splitlines()[-3:]}
            if s + 1 < b:
                todo.insert(0, (s + 1, b))


def summarize(records: list, seconds: float, raw: bool) -> dict:
    ours = Counter("refused" if r["ours"].startswith("refused") else
                   "bug" if r["ours"].startswith("bug") else r["ours"] for r in records)
    reasons = Counter(r["ours"][len("refused: "):] for r in records if r["ours"].startswith("refused"))
    out = {"mutations": len(records), "seconds": round(seconds, 1), "ours": dict(ours),
           "refusal_reasons": dict(reasons.most_common()),
           "bugs": [r for r in records if r["ours"].startswith("bug")][:20],
           "crashes": [r for r in records if r["ours"] == "crash"][:20]}
    if raw:
        out["ggml"] = dict(Counter((r["ggml"] or "").split(":")[0] for r in records))
        out["ggml_alloc"] = dict(Counter((r["ggml_alloc"] or "") for r in records))
        out["ggml_crashes"] = [r for r in records if "crash" in (r["ggml"], r["ggml_alloc"])][:20]
        out["ggml_reasons"] = dict(Counter(r["ggml"][6:] for r in records
                                           if (r["ggml"] or "").startswith("null")).most_common(25))
        out["ours_refused_ggml_accepted"] = dict(Counter(
            r["ours"][len("refused: "):] for r in records
            if r["ours"].startswith("refused") and r["ggml"] == "ok").most_common())
        out["ours_ok_ggml_refused"] = [r for r in records if r["ours"] == "ok" and r["ggml"] != "ok"][:20]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0, help="first seed (mutation i uses seed+i)")
    ap.add_argument("--dir", help="folder of .gguf files (default: extract the vocab files)")
    ap.add_argument("--batch", type=int, default=250, help="mutations per child process")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--raw", action="store_true", help="also run ggml's parser alone")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--files", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.files, *args.child, args.raw, args.tmp)
        return 0
    with tempfile.TemporaryDirectory(prefix="fuzz_gguf_") as tmp:
        work = Path(tmp)
        files = sorted(Path(args.dir).glob("*.gguf")) if args.dir else extract_vocab(work)
        files.append(tensor_file(work))
        t0 = time.perf_counter()
        records = list(run_batches(files, range(args.seed, args.seed + args.count), args.batch,
                                   args.jobs, args.raw, tmp))
        summary = summarize(records, time.perf_counter() - t0, args.raw)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{summary['mutations']} mutations of {len(files)} files in {summary['seconds']} s "
              f"({args.jobs} jobs)")
        print("gg.gguf.read:", summary["ours"])
        for k, v in summary["refusal_reasons"].items():
            print(f"  {v:6d}  {k}")
        for key in ("bugs", "crashes", "ggml_crashes"):
            for r in summary.get(key, []):
                print(f"{key[:-1].upper()}: seed {r['seed']} {r['file']} {r['mutation']}: "
                      f"{r['ours']} {r.get('signal', '')} {r.get('stderr', '')}")
        if args.raw:
            print("ggml gguf_init_from_buffer:", summary["ggml"])
            print("ggml gguf_init_from_file (no_alloc=false):", summary["ggml_alloc"])
            print("refused by gg.gguf.read, accepted by ggml:")
            for k, v in summary["ours_refused_ggml_accepted"].items():
                print(f"  {v:6d}  {k}")
    return 1 if summary["bugs"] or summary["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
