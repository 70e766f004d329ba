"""python -m ggml_py compare: two real releases side by side (0.20.2 vs the default on CPU + RPC),
each side in its own processes, the JSON checked against docs/compare-schema.json; the crash
isolation of the op matrix; the renderings."""
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import skip_without_index
from ggml_build import pins

import ggml_py as gg
from ggml_py.compare import _diff, _report, render

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
NEW = pins.load_manifest()[0]      # the default release (built by the quick start)
NEW_RPC = {"0.25.3": 7, "0.26.0": 8}[NEW]   # its RPC protocol's major version
SCHEMA = json.loads((ROOT / "docs" / "compare-schema.json").read_text())
# a slice of the matrix that keeps the test short: ops whose support moved between 0.20.2 and
# 0.25.3 (so also the default, 0.26.0) and a few that did not
OPS = "add,scale,silu,gelu,mul_mat,get_rows,top_k,soft_max,rope_ext,flash_attn_ext,set_rows"
TYPES = "f32,f16,bf16,q8_0"


def compare(*args, env=None, timeout=1800):
    r = subprocess.run([sys.executable, "-m", "ggml_py.compare", *args, "-q"], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode == 2:
        skip_without_index(r.stderr, "building the other release")
    assert r.returncode in (0, 1), r.stderr[-3000:]
    return r


def validate(report: dict) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(report, SCHEMA)


@pytest.fixture(scope="module")
def old_new(tmp_path_factory):
    """0.20.2 vs the default on CPU + RPC (builds what is missing: the folders test_releases.py
    builds and uses as well)."""
    out = tmp_path_factory.mktemp("compare") / "report.json"
    r = compare("0.20.2", NEW, "--backends", "cpu,rpc", "--ops", OPS, "--types", TYPES,
                "--rounds", "2", "--format", "json", "-o", str(out))
    return json.loads(out.read_text()), r


@pytest.mark.slow
def test_two_releases_json_matches_the_schema(old_new):
    rep, r = old_new
    validate(rep)
    assert (rep["a"]["version"], rep["b"]["version"]) == ("0.20.2", NEW)
    assert rep["a"]["folder"] != rep["b"]["folder"]
    # the exit status says whether something regressed, and the summary says what first
    assert r.returncode == (1 if rep["regressions"] else 0)
    head = r.stderr.splitlines()
    assert head[0].startswith("A: ggml 0.20.2")
    first = next(i for i, ln in enumerate(head) if "regression(s)" in ln)
    assert head[first + 1].startswith("what breaks:")
    # RPC 5 -> the default's: tried, and breaking
    assert any(i["kind"] == "rpc" for i in rep["verdict"]["breaking"])


@pytest.mark.slow
def test_two_releases_api(old_new):
    rep, _ = old_new
    api = rep["api"]
    assert api["layout_source"] == ["compiler", "compiler"]
    f = api["functions"]
    assert f["count"]["b"] > f["count"]["a"] > 500
    assert {"ggml_swiglu_clamp", "ggml_rope_set_offset"} <= set(f["added"]) and not f["removed"]
    assert api["constants"]["changed"]["RPC_PROTO_MAJOR_VERSION"] == [5, NEW_RPC]
    # enums: a value inserted before GGML_GLU_OP_COUNT moves it; new members of ggml_prec
    enums = {e["name"]: e for e in api["enums"]["changed"]}
    assert enums["enum ggml_glu_op"]["added"] == {"GGML_GLU_OP_SWIGLU_CLAMP": 6}
    assert enums["enum ggml_glu_op"]["moved"] == {"GGML_GLU_OP_COUNT": [6, 7]}
    assert "GGML_PREC_BF16" in enums["enum ggml_prec"]["added"]
    # the compiler finds no struct layout that changed between these two (see the next test
    # for one that did)
    assert api["structs"]["changed"] == []


@pytest.mark.slow
def test_a_struct_layout_and_op_numbers_that_moved(tmp_path):
    """0.15.3 vs the default, API only: ggml_backend_dev_caps grew a field (its size, from the
    compiler, 4 -> 5) and GGML_OP_* values moved (serialized graphs do not carry over)."""
    out = tmp_path / "api.json"
    compare("0.15.3", NEW, "--backends", "cpu,rpc", "--api-only", "--format", "json",
            "-o", str(out))
    rep = json.loads(out.read_text())
    validate(rep)
    assert rep["ops"] == [] and rep["speed"] == []
    structs = {s["name"]: s for s in rep["api"]["structs"]["changed"]}
    caps = structs["struct ggml_backend_dev_caps"]
    assert caps["size"] == [4, 5]
    assert caps["fields_added"] == [{"name": "mmap_support", "type": "_Bool", "offset": 4, "bits": None}]
    moved = {e["name"]: e for e in rep["api"]["enums"]["changed"]}["enum ggml_op"]["moved"]
    assert moved["GGML_OP_UNARY"] == [87, 91]
    # the runtime shows the new cap on both devices
    changed = {d["name"]: d for d in rep["runtime"]["devices"]["changed"]}
    assert changed["CPU"]["caps"]["mmap_support"] == [None, True]


@pytest.mark.slow
def test_two_releases_runtime(old_new):
    rep, _ = old_new
    rt = rep["runtime"]
    assert rt["rpc_protocol"] == ["5.0.0", f"{NEW_RPC}.0.0"]
    # 0.20.2's RPC devices have no events and no async, the default's have
    changed = {d["name"]: d for d in rt["devices"]["changed"]}
    assert changed["RPC0"]["caps"] == {"async": [False, True], "events": [False, True]}
    assert [d["name"] for d in rt["b"]["devices"]] == ["CPU", "RPC0"]


@pytest.mark.slow
def test_two_releases_op_matrix(old_new):
    rep, _ = old_new
    rows = {(r["device"], r["op"], r["type"]): r for r in rep["ops"]}
    assert {d for d, _, _ in rows} == {"CPU", "RPC0"}
    same = rows[("CPU", "mul_mat", "f32")]
    assert same["a"]["status"] == same["b"]["status"] == "ok"
    assert same["nmse_ab"] is not None and same["nmse_ab"] < 1e-10
    # ops whose support differs: 0.20.2's CPU kernels do not compute bf16 scale/silu/gelu (the
    # cells run ggml itself: it aborts or errs), which ggml_py's per-release type rules refuse
    # there (a separate column); the default computes them
    improved = {(r["device"], r["op"], r["type"]) for r in rep["ops"] if r["verdict"] == "improved"}
    assert {("CPU", "scale", "bf16"), ("CPU", "silu", "bf16"), ("RPC0", "gelu", "bf16")} <= improved
    old_cell = rows[("CPU", "scale", "bf16")]["a"]
    assert old_cell["status"] in ("crash", "fail", "error", "unsupported")
    assert old_cell["rule"] == "refused" and "from 0.25.3 on" in old_cell["rule_error"]
    assert rows[("RPC0", "scale", "bf16")]["a"]["rule"] == "refused"
    # every cell has a verdict the schema knows and a threshold where something computed
    assert all(r["threshold"] for r in rep["ops"] if "ok" in (r["a"]["status"], r["b"]["status"]))


@pytest.mark.slow
def test_two_releases_speed_and_renderings(old_new):
    rep, _ = old_new
    assert rep["speed_meta"]["rounds"] == 2 and rep["speed"]
    for row in rep["speed"]:
        assert row["a_us"] > 0 and row["b_us"] > 0 and row["ratio"] > 0
    md = render(rep, "md")
    for section in ("## What breaks", "## API", "### Structs", "### Enums", "## Runtime",
                    "## Ops", "## Speed"):
        assert section in md
    page = render(rep, "html")
    assert page.startswith("<!doctype html>") and "<svg" in page and 'class=grid' in page
    assert "src=" not in page and "http://" not in page.replace("http://www.w3.org", "")


def test_a_cell_that_aborts_its_process_is_one_crashed_cell(tmp_path):
    """ggml_abort() in one cell (asked for through the worker's test hook) marks that cell on
    both sides; the cells after it still run, in a new worker process."""
    out = tmp_path / "self.json"
    env = dict(os.environ, GGML_PY_COMPARE_ABORT_AT="CPU/add/f16")
    build = str(gg.BUILD_DIR)
    r = compare(build, build, "--ops", "add,mul", "--types", "f32,f16", "--devices", "CPU",
                "--rounds", "0", "--format", "json", "-o", str(out), env=env, timeout=600)
    rep = json.loads(out.read_text())
    validate(rep)
    rows = {(r["op"], r["type"]): r for r in rep["ops"]}
    crashed = rows[("add", "f16")]
    assert crashed["a"]["status"] == crashed["b"]["status"] == "crash"
    assert "abort requested at CPU/add/f16" in crashed["a"]["error"]
    assert crashed["verdict"] == "same"
    for key in [("add", "f32"), ("mul", "f32"), ("mul", "f16")]:
        assert rows[key]["a"]["status"] == rows[key]["b"]["status"] == "ok"
        assert rows[key]["nmse_ab"] == 0.0
    assert rep["regressions"] == [] and r.returncode == 0
    assert rep["api"]["functions"]["added"] == rep["api"]["functions"]["removed"] == []
    # RPC tried across the sides (the same build: every pair talks), nothing breaking
    cross = rep["runtime"]["rpc_cross"]
    assert [c["roles"] for c in cross] == [["a", "a"], ["b", "b"], ["a", "b"], ["b", "a"]]
    assert all(c["talks"] and c["outcome"] == "talks" for c in cross)
    assert rep["verdict"]["breaking"] == [] and rep["verdict"]["same"]["by_kind"]["rpc"] == 1


@pytest.mark.slow
def test_the_rpc_protocol_break_is_breaking_and_exits_1(tmp_path):
    """0.25.3 vs 0.26.0 (RPC 7 -> 8): a client of each side against a server of the other,
    tried: both abort in ggml's handshake, while each side talks to itself; the report opens
    with it as breaking, and the exit status is 1."""
    out = tmp_path / "rpc.json"
    r = compare("0.25.3", "0.26.0", "--backends", "cpu,rpc", "--ops", "add", "--types", "f32",
                "--rounds", "0", "--format", "json", "-o", str(out))
    rep = json.loads(out.read_text())
    validate(rep)
    assert r.returncode == 1
    (rpc,) = [i for i in rep["verdict"]["breaking"] if i["kind"] == "rpc"]
    assert rpc["what"].startswith("RPC protocol 7.0.0 -> 8.0.0")
    assert "a 0.25.3 client cannot use a 0.26.0 server" in rpc["what"]
    assert "a 0.26.0 client cannot use a 0.25.3 server" in rpc["what"]
    cross = {tuple(c["roles"]): c for c in rep["runtime"]["rpc_cross"]}
    assert cross[("a", "a")]["talks"] and cross[("b", "b")]["talks"]
    for pair, theirs in ((("a", "b"), "8.0.0"), (("b", "a"), "7.0.0")):
        c = cross[pair]
        assert not c["talks"] and c["outcome"] == "aborted" and c["signal"] == "SIGABRT"
        assert f"RPC server version mismatch: {theirs}" in c["message"]
    assert rep["regressions"][0].startswith("RPC protocol 7.0.0 -> 8.0.0")
    # every rendering opens with it
    for fmt in ("md", "html", "text"):
        text = html.unescape(render(rep, fmt))
        api = re.search(r"(?<!release by )API\b", text)      # the API section (not identity)
        assert api and text.index("RPC protocol 7.0.0 -> 8.0.0") < api.start()


def test_a_side_that_does_not_exist_is_an_error_not_a_traceback():
    r = subprocess.run([sys.executable, "-m", "ggml_py.compare", "0.0.1", NEW, "-q"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "neither a pinned release" in r.stderr and "Traceback" not in r.stderr


# -- the verdicts, on hand-made cells (the diff functions are pure) ---------------------------
def _cell(status, nmse=None):
    c = {"status": status}
    if status in ("ok", "fail"):
        c.update(nmse=nmse or 0.0, threshold=1e-7, out="AACAPw==")   # one float32: 1.0
    return c


@pytest.mark.parametrize("a, b, verdict", [
    ("ok", "fail", "regressed"), ("ok", "crash", "regressed"), ("ok", "unsupported", "regressed"),
    ("unsupported", "crash", "regressed"), ("fail", "ok", "improved"), ("refused", "ok", "improved"),
    ("ok", "ok", "same"), ("unsupported", "error", "changed"), ("crash", "crash", "same"),
])
def test_verdicts(a, b, verdict):
    (row,) = _diff.ops([["CPU", "add", "f32"]], [_cell(a)], [_cell(b)])
    assert row["verdict"] == verdict
    rep = {"ops": [row], "api": {"functions": {"removed": []}}, "speed": []}
    assert bool(_diff.regressions(rep)) == (verdict == "regressed")


def test_cells_both_sides_refuse_are_left_out():
    assert _diff.ops([["CPU", "add", "i8"]], [_cell("refused")], [_cell("refused")]) == []


def test_removed_functions_and_slowdowns_beyond_the_limit_regress():
    funcs = _diff.functions({"f": {"result": "int", "args": ["int"]}, "g": {"result": "int", "args": []}},
                            {"f": {"result": "int", "args": ["int64_t"]}})
    assert funcs["removed"] == ["g"] and funcs["changed"][0]["b"] == "int (int64_t)"
    rows, meta = _diff.speed([{"CPU/add": 10.0}, {"CPU/add": 10.2}],
                             [{"CPU/add": 30.0}, {"CPU/add": 30.3}], max_slowdown=2.0)
    assert rows[0]["flag"] == "slower" and rows[0]["regressed"] and meta["noise_max"] < 0.05
    rows, _ = _diff.speed([{"CPU/add": 10.0}, {"CPU/add": 10.2}],
                          [{"CPU/add": 30.0}, {"CPU/add": 30.3}], max_slowdown=None)
    assert rows[0]["flag"] == "slower" and not rows[0]["regressed"]
    rep = {"ops": [], "api": {"functions": funcs}, "speed": rows}
    assert _diff.regressions(rep) == ["function removed: g"]


def test_struct_and_enum_diffs():
    fa = [{"name": "x", "type": "int", "offset": 0, "bits": None},
          {"name": "y", "type": "int", "offset": 4, "bits": None}]
    fb = [{"name": "w", "type": "char", "offset": 0, "bits": None},
          {"name": "x", "type": "int", "offset": 4, "bits": None},
          {"name": "y", "type": "long", "offset": 8, "bits": None}]
    s = _diff.structs({"struct s": {"opaque": False, "size": 8, "align": 4, "fields": fa}},
                      {"struct s": {"opaque": False, "size": 16, "align": 8, "fields": fb}})
    (c,) = s["changed"]
    assert c["size"] == [8, 16] and [f["name"] for f in c["fields_added"]] == ["w"]
    assert c["fields_retyped"] == [{"name": "y", "a": "int", "b": "long"}]
    assert {f["name"] for f in c["fields_moved"]} == {"x", "y"}
    e = _diff.enums({"enum op": {"A": 0, "B": 1}}, {"enum op": {"A": 0, "N": 1, "B": 2}})
    assert e["changed"][0]["moved"] == {"B": [1, 2]} and e["changed"][0]["added"] == {"N": 1}
    assert "B 1->2" in "\n".join(_report.summary_lines({
        "a": {"version": "1", "name": "a", "bindings": "api"}, "b": {"version": "2", "name": "b", "bindings": "api"},
        "regressions": [], "api": {"functions": {"count": {"a": 0, "b": 0}, "added": [], "removed": [], "changed": []},
                                   "structs": s, "enums": e, "constants": {"changed": {}}},
        "runtime": {"rpc_protocol": [None, None], "devices": {"added": [], "removed": [], "changed": []}},
        "ops": [], "speed": [], "speed_meta": {}}))


@pytest.mark.slow
def test_newer_to_older_is_a_regression_and_exits_1(old_new, tmp_path):
    """The same pair the other way round: bf16 scale computed on the default does not compute on
    0.20.2 (its CPU kernel aborts), a regression, so the exit status is 1 (what CI gates on)."""
    out = tmp_path / "back.json"
    r = compare(NEW, "0.20.2", "--backends", "cpu,rpc", "--ops", "scale", "--types", "bf16",
                "--devices", "CPU", "--rounds", "0", "--format", "json",
                "-o", str(out))
    rep = json.loads(out.read_text())
    validate(rep)
    assert r.returncode == 1
    assert any(x.startswith("op scale bf16 on CPU: ok -> ") for x in rep["regressions"])
    assert "function removed: ggml_swiglu_clamp" in rep["regressions"]


# -- bad command lines: one line on stderr, exit 2, nothing built or run -----------------------
@pytest.mark.parametrize("args, says", [
    (["--backends", "cpu,nope"], "unknown backend(s): nope"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--threads", "x"], "invalid int value"),
    (["--rounds", "-1"], "--rounds must be at least 0"),
    (["--max-slowdown", "0"], "--max-slowdown must be a positive"),
    (["-o", "/no/such/dir/r.json"], "does not exist"),
    (["-o", "/"], "is a folder"),
    (["--ops", "ad,mul"], "unknown op(s): ad; valid: add, sub"),
    (["--types", "f32,f33"], "unknown type(s): f33; valid: f32, f16"),
    (["--ops", ","], "--ops is empty"),
    (["--devices", "CPUU", "--ops", "add", "--rounds", "0"], "unknown device(s): CPUU; valid: CPU"),
    (["--backend-ops", "tset"], "--backend-ops must be"),
])
def test_bad_arguments_are_one_line_errors(args, says):
    build = str(gg.BUILD_DIR)
    r = subprocess.run([sys.executable, "-m", "ggml_py", "compare", build, build, *args, "-q"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], r.stderr
    assert r.stdout == ""


def test_a_source_that_is_no_ggml_tree_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ggml_py", "compare", str(gg.BUILD_DIR),
                        "--source", str(tmp_path), "-q"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "is not a ggml tree" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# -- the op matrix measures the build, not ggml_py's rules -------------------------------------
@pytest.fixture(scope="module")
def self_matrix(tmp_path_factory):
    """The loaded build against itself, on cells where ggml_py's rule and the build disagree
    (sum f16: refused by the rule, computed right by ggml's CPU) and where the kernel aborts
    (add i8), with f32 cells that every rule allows."""
    out = tmp_path_factory.mktemp("self") / "self.json"
    build = str(gg.BUILD_DIR)
    r = compare(build, build, "--ops", "sum,add,rope_ext,conv_1d,top_k", "--types", "f32,f16,i8",
                "--devices", "CPU", "--rounds", "0", "--format", "json", "-o", str(out),
                timeout=900)
    return json.loads(out.read_text()), r


def test_cells_run_ggml_itself_and_the_rule_is_a_column(self_matrix):
    rep, r = self_matrix
    validate(rep)
    rows = {(x["op"], x["type"]): x for x in rep["ops"]}
    # f32: the replayed calls compute what numpy computes (the recording reproduces ggml_py's
    # calls: rope's parameters, conv_1d's layout fix, top_k)
    for op in ("sum", "add", "rope_ext", "conv_1d", "top_k"):
        assert rows[(op, "f32")]["b"]["status"] == "ok", rows[(op, "f32")]
        assert rows[(op, "f32")]["b"]["rule"] == "allowed"
    # sum f16: ggml_py refuses, the build computes it right
    s = rows[("sum", "f16")]["b"]
    assert s["rule"] == "refused" and s["status"] == "ok" and s["nmse"] < s["threshold"]
    # add i8: the build aborts in its kernel; the cell says where and what ggml said
    a = rows[("add", "i8")]["b"]
    assert a["status"] == "crash" and a["signal"] == "SIGABRT" and a["stage"] == "compute"
    assert "ggml-cpu" in a["error"] and a["rule"] == "refused"
    assert r.returncode == 0


def test_a_cell_where_rule_and_build_disagree_is_listed(self_matrix):
    rep, _ = self_matrix
    dis = {(d["device"], d["op"], d["type"]): d for d in rep["rule_disagreements"]}
    d = dis[("CPU", "sum", "f16")]
    assert d["kind"] == "too strict" and d["status"] == "ok" and "InvalidType" in d["detail"]
    # the same build on both sides: listed once
    assert len(rep["rule_disagreements"]) == len(dis)
    # aborting cells the rule refuses are agreement, not listed
    assert ("CPU", "add", "i8") not in dis
    md = render(rep, "md")
    sec = md[md.index("### Where ggml_py's rule and the build disagree"):]
    assert "| CPU | sum | f16 | refused (too strict) | computes, matches |" in sec


def test_a_side_is_identified(self_matrix):
    rep, _ = self_matrix
    ident = rep["b"]["identity"]
    assert ident["public_functions"] > 500
    near = ident["nearest_release"]
    assert near["release"] == gg.BUILD.get("release") and near["summary"] == "the same public functions"
    if ident["tree"]:
        assert len(ident["tree_hash"]) == 64
    ext = rep["runtime"]["extensions"]
    assert ext["symbol ggml_backend_meta_device"] == [True, True]
    assert ext["CPU: ggml_backend_set_n_threads"] == [True, True]
    assert "RPC: ggml_backend_comm_init" in ext


# -- the committed example reports: rendered from their JSON by this code, so they cannot go
# stale (GGML_PY_UPDATE_DOCS=1 rewrites them); the slow test reruns the recorded command
DOC_REPORTS = sorted((ROOT / "docs").glob("compare-*.json"))
DOC_REPORTS = [p for p in DOC_REPORTS if p.name != "compare-schema.json"]


def test_every_committed_example_report_has_its_json():
    mds = sorted((ROOT / "docs").glob("compare-*.md"))
    assert mds, "no example report"
    for md in mds:
        assert md.with_suffix(".json").exists(), f"{md.name} has no JSON to regenerate it from"


@pytest.mark.parametrize("path", DOC_REPORTS, ids=lambda p: p.name)
def test_committed_example_reports_are_rendered_from_their_json(path):
    from ggml_py.compare import load
    rep = load(path)
    validate(rep)
    text = render(rep, "md")
    md = path.with_suffix(".md")
    if os.environ.get("GGML_PY_UPDATE_DOCS"):
        md.write_text(text)
    assert md.read_text() == text, f"{md.name} is stale: GGML_PY_UPDATE_DOCS=1 rewrites it"


@pytest.mark.slow
@pytest.mark.parametrize("path", DOC_REPORTS, ids=lambda p: p.name)
def test_committed_example_reports_match_a_fresh_run(path, tmp_path):
    """The recorded command run again: the same cells with the same outcomes, the same
    breaking items (timings differ from run to run and are not compared)."""
    old = json.loads(path.read_text())
    cmd = old["command"][4:]
    if "-o" in cmd:
        cmd[cmd.index("-o") + 1] = str(tmp_path / "fresh.json")
    compare(*cmd)
    new = json.loads((tmp_path / "fresh.json").read_text())
    cells = lambda r: {(x["device"], x["op"], x["type"]): (x["a"]["status"], x["b"]["status"],   # noqa: E731
                                                           x["a"].get("rule"), x["b"].get("rule"))
                       for x in r["ops"]}
    assert cells(new) == cells(old)
    kinds = lambda r: sorted(i["what"] for i in r["verdict"]["breaking"])   # noqa: E731
    assert kinds(new) == kinds(old)


def test_speed_flags_only_beyond_the_bootstrap_interval_and_labels_fit_the_plot():
    import re
    # a noisy pair whose medians differ by 1.3x: the interval straddles 1, no flag
    noisy_a = [{"CPU/add": t} for t in (10.0, 14.0, 8.0, 12.0, 9.0)]
    noisy_b = [{"CPU/add": t} for t in (13.0, 9.0, 16.0, 11.0, 15.0)]
    rows, meta = _diff.speed(noisy_a, noisy_b, max_slowdown=1.1)
    (row,) = rows
    lo, hi = row["interval"]
    assert lo < 1 < hi and row["flag"] is None and not row["regressed"]
    assert "bootstrap" in meta["method"]
    # a steady 3x: flagged, and beyond --max-slowdown 2 by the interval's lower end
    rows, _ = _diff.speed([{"CPU/a_very_long_op_name_x": 10.0 + i * 0.1} for i in range(5)],
                          [{"CPU/a_very_long_op_name_x": 30.0 + i * 0.1} for i in range(5)], 2.0)
    assert rows[0]["flag"] == "slower" and rows[0]["regressed"] and rows[0]["interval"][0] > 2
    svg = _report._svg_speed(rows + [row])
    width = float(re.search(r'width="([\d.]+)"', svg).group(1))
    for m in re.finditer(r'<text x="([\d.]+)"[^>]*?( text-anchor="(\w+)")?[^>]*>([^<]*)</text>', svg):
        x, anchor, text = float(m.group(1)), m.group(3) or "start", html.unescape(m.group(4))
        extent = 7.0 * len(text)          # (11 px sans-serif: at most ~7 px a character)
        if anchor == "end":
            assert x - extent >= 0, text
        elif anchor == "start":
            assert x + extent <= width + 0.5 * extent, text   # (estimate: room to spare)


def test_a_cell_that_kills_its_rpc_server_keeps_the_rule(tmp_path):
    """rms_norm and scale of f16 and q8_0 on RPC0: the server dies in the kernel. RPC computes
    are queued, so the worker meets the dead server either inside ggml's client (the worker
    aborts; the parent keeps the rule it printed) or at ggml_py's liveness check when it reads
    the result (an RPCError; the worker reports the crash itself). The second path dropped the
    rule column (a CI run under load: None where the committed report says "refused")."""
    out = tmp_path / "rpc.json"
    build = str(gg.BUILD_DIR)
    r = compare(build, build, "--ops", "rms_norm,scale", "--types", "f16,q8_0", "--devices",
                "RPC0", "--rounds", "0", "--format", "json", "-o", str(out), timeout=600)
    rep = json.loads(out.read_text())
    cells = [x for x in rep["ops"] if x["device"] == "RPC0"]
    assert len(cells) == 4
    for cell in cells:
        for side in ("a", "b"):
            assert cell[side]["status"] == "crash", cell
            assert cell[side]["rule"] == "refused" and cell["op"] in cell[side]["rule_error"], cell
    assert r.returncode == 0
