"""Renderings of a comparison report: terminal summary, markdown, self-contained HTML."""
from __future__ import annotations

import html
import math

STATUS_MARK = {"ok": "ok", "fail": "FAIL", "crash": "CRASH", "timeout": "TIMEOUT", "error": "err",
               "unsupported": "unsup", "refused": "-", "absent": "absent"}
COLOURS = {"ok": "#4caf50", "fail": "#e53935", "crash": "#6a1b9a", "timeout": "#6a1b9a",
           "error": "#ff9800", "unsupported": "#bdbdbd", "refused": "#f5f5f5", "absent": "#ffffff"}
MEANING = {"ok": "computes, matches", "fail": "computes wrong", "crash": "aborts",
           "timeout": "hangs", "error": "error", "unsupported": "unsupported",
           "refused": "no such cell", "absent": "no such device"}
VERDICT_ORDER = {"regressed": 0, "changed": 1, "differs": 2, "improved": 3, "same": 4}


def _e(x) -> str:
    return f"{x:.2e}" if isinstance(x, float) and math.isfinite(x) else "-" if x is None else str(x)


def _side(s: dict) -> str:
    return f"ggml {s['version']} ({s['name']}, {s['bindings']} bindings)"


def verdict_of(rep: dict) -> dict:
    if rep.get("verdict"):
        return rep["verdict"]
    from ._verdict import verdict
    return verdict(rep)


def _same_line(v: dict) -> str:
    return f"{v['same']['count']} same (" + ", ".join(
        f"{k} {n}" for k, n in v["same"]["by_kind"].items()) + ")"


def verdict_lines(rep: dict) -> list[str]:
    """What breaks, for the terminal: breaking items with their evidence, changed items (at
    most 15 listed), the same ones counted."""
    v = verdict_of(rep)
    out = [f"what breaks: {len(v['breaking'])} breaking, {len(v['changed'])} changed, "
           + _same_line(v)]
    for i in v["breaking"]:
        out.append(f"  BREAKING {i['what']}")
        if i["evidence"]:
            out += [f"           {e.strip()}" for e in i["evidence"].split("; ")]
    for i in v["changed"][:15]:
        out.append(f"  changed  {i['what']}")
    if len(v["changed"]) > 15:
        out.append(f"  changed  ... {len(v['changed']) - 15} more (see the md/html/json report)")
    return out


def identity_line(s: dict) -> str:
    ident = s.get("identity") or {}
    bits = []
    if ident.get("tree_hash"):
        bits.append(f"tree sha256 {ident['tree_hash'][:16]}")
    if ident.get("nearest_release"):
        n = ident["nearest_release"]
        bits.append(f"nearest pinned release by API: {n['release']} ({n['summary']})")
    return "; ".join(bits)


def summary_lines(rep: dict) -> list[str]:
    """The terminal summary: what breaks first, then what changed, then counts."""
    a, b = rep["a"], rep["b"]
    out = [f"A: {_side(a)}", f"B: {_side(b)}"]
    for k, s in (("A", a), ("B", b)):
        if identity_line(s):
            out.append(f"   {k}: {identity_line(s)}")
    regs = rep["regressions"]
    out.append(f"\n{len(regs)} regression(s) (breaking items: exit status 1)")
    out += verdict_lines(rep)
    f = rep["api"]["functions"]
    out.append(f"\nAPI: functions {f['count']['a']} -> {f['count']['b']}: +{len(f['added'])} "
               f"-{len(f['removed'])} ~{len(f['changed'])}; structs changed "
               f"{len(rep['api']['structs']['changed'])}, enums changed "
               f"{len(rep['api']['enums']['changed'])}, constants changed "
               f"{len(rep['api']['constants']['changed'])}")
    for s in rep["api"]["structs"]["changed"][:8]:
        out.append(f"  {s['name']}: " + _struct_line(s))
    for e in rep["api"]["enums"]["changed"]:
        if e["moved"]:
            out.append(f"  {e['name']}: {len(e['moved'])} value(s) moved, e.g. "
                       + ", ".join(f"{k} {v[0]}->{v[1]}" for k, v in list(e["moved"].items())[:3]))
    rt = rep["runtime"]
    out.append(f"\nruntime: RPC protocol {rt['rpc_protocol'][0]} -> {rt['rpc_protocol'][1]}; "
               f"devices +{rt['devices']['added']} -{rt['devices']['removed']}")
    for d in rt["devices"]["changed"]:
        out.append(f"  {d['name']}: " + "; ".join(f"{k} {v}" for k, v in d.items() if k != "name"))
    counts: dict[str, int] = {}
    for r in rep["ops"]:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    out.append(f"\nops: {len(rep['ops'])} cells: " + ", ".join(f"{k} {v}" for k, v in
                                                             sorted(counts.items(), key=lambda kv: VERDICT_ORDER.get(kv[0], 9))))
    for r in sorted(rep["ops"], key=lambda r: VERDICT_ORDER.get(r["verdict"], 9)):
        if r["verdict"] in ("changed", "improved", "differs"):
            out.append(f"  {r['verdict']:<9} {r['device']:<6} {r['op']:<16} {r['type']:<5} "
                       f"{r['a']['status']} -> {r['b']['status']}"
                       + (f" (A vs B NMSE {_e(r['nmse_ab'])})" if r["verdict"] == "differs" else ""))
    dis = rep.get("rule_disagreements") or []
    if dis:
        out.append(f"\nggml_py's rule and the build disagree in {len(dis)} cell(s):")
        for d in dis[:12]:
            out.append(f"  {d['kind']:<10} {d['build']}: {d['device']} {d['op']} {d['type']}: rule "
                       f"{d['rule']}, the build {MEANING.get(d['status'], d['status'])}")
    sm = rep["speed_meta"]
    if rep["speed"]:
        out.append(f"\nspeed: {sm['rounds']} rounds each, median noise "
                   f"{sm['noise_median'] * 100:.1f}% (max {sm['noise_max'] * 100:.1f}%)")
        for r in sorted(rep["speed"], key=lambda r: -abs(math.log(r["ratio"]))):
            if r["flag"]:
                out.append(f"  {r['flag']:<6} {r['device']:<6} {r['op']:<16} {r['ratio']:.2f}x "
                           f"({r['a_us']:.1f} -> {r['b_us']:.1f} us)")
    if rep.get("backend_ops"):
        bo = rep["backend_ops"]
        out.append(f"\ntest-backend-ops: {bo.get('summary', bo.get('note'))}")
    return out


def _struct_line(s: dict) -> str:
    if "opaque" in s:
        return f"opaque {s['opaque'][0]} -> {s['opaque'][1]}"
    parts = []
    if s["size"][0] != s["size"][1]:
        parts.append(f"size {s['size'][0]} -> {s['size'][1]}")
    parts += [f"+{f['name']} ({f['type']} @{f['offset']})" for f in s["fields_added"]]
    parts += [f"-{f['name']}" for f in s["fields_removed"]]
    parts += [f"{f['name']}: {f['a']} -> {f['b']}" for f in s["fields_retyped"]]
    if s["fields_moved"]:
        parts.append(f"{len(s['fields_moved'])} field(s) moved, e.g. " + ", ".join(
            f"{f['name']} @{f['a']}->@{f['b']}" for f in s["fields_moved"][:3]))
    return "; ".join(parts)


def markdown(rep: dict) -> str:
    """The report as markdown: sides, what breaks, API, runtime, ops, speed, test-backend-ops."""
    a, b = rep["a"], rep["b"]
    L = [f"# ggml {a['version']} vs {b['version']}", "",
         f"- **A**: {_side(a)}", f"- **B**: {_side(b)}",
         f"- generated by `python -m ggml_py compare` ({rep['generated']})", ""]
    for k, s in (("A", a), ("B", b)):
        if identity_line(s):
            L.insert(4, f"- **{k} identity**: {identity_line(s)}")
    L += verdict_markdown(rep)
    L += _api_markdown(rep["api"])
    L += _runtime_markdown(rep["runtime"])
    L += _ops_markdown(rep)
    L += _speed_markdown(rep)
    if rep.get("backend_ops"):
        bo = rep["backend_ops"]
        L += ["", "## test-backend-ops", "", str(bo.get("summary", bo.get("note")))]
        for k in ("appeared", "vanished", "started_passing", "stopped_passing"):
            if bo.get(k):
                L.append(f"\n{k.replace('_', ' ')}: " + ", ".join(f"`{x}`" for x in bo[k][:50]))
    return "\n".join(L) + "\n"


def _api_markdown(api: dict) -> list[str]:
    """The API section: functions added, removed and changed, then structs, enums, constants."""
    f = api["functions"]
    L = ["", "## API", "",
         f"Functions: {f['count']['a']} -> {f['count']['b']} (layouts from the "
         f"{' / '.join(sorted(set(api['layout_source'])))}).", ""]
    if f["added"]:
        L += ["Added: " + ", ".join(f"`{n}`" for n in f["added"]), ""]
    if f["removed"]:
        L += ["Removed: " + ", ".join(f"`{n}`" for n in f["removed"]), ""]
    if f["changed"]:
        L += ["| changed function | A | B |", "|---|---|---|"]
        L += [f"| `{c['name']}` | `{c['a']}` | `{c['b']}` |" for c in f["changed"]]
        L.append("")
    st = api["structs"]
    L += ["### Structs", ""]
    if st["added"] or st["removed"]:
        L += [f"Added: {', '.join(st['added']) or '-'}; removed: {', '.join(st['removed']) or '-'}", ""]
    L += ([f"- `{s['name']}`: {_struct_line(s)}" for s in st["changed"]] or ["No layout changed."])
    return L + _enums_markdown(api["enums"]) + _constants_markdown(api["constants"])


def _enums_markdown(enums: dict) -> list[str]:
    """The enums subsection: enums added or removed, and per changed enum its values' moves."""
    L = ["", "### Enums", ""]
    if enums["added"] or enums["removed"]:
        L += [f"Added: {', '.join(enums['added']) or '-'}; removed: "
              f"{', '.join(enums['removed']) or '-'}", ""]
    for e in enums["changed"]:
        parts = []
        if e["added"]:
            parts.append("added " + ", ".join(f"`{k}`={v}" for k, v in e["added"].items()))
        if e["removed"]:
            parts.append("removed " + ", ".join(f"`{k}`" for k in e["removed"]))
        if e["moved"]:
            parts.append("**moved** " + ", ".join(f"`{k}` {v[0]}->{v[1]}" for k, v in e["moved"].items()))
        L.append(f"- `{e['name']}`: " + "; ".join(parts))
    if not enums["changed"]:
        L.append("No enum changed.")
    return L


def _constants_markdown(c: dict) -> list[str]:
    """The integer constants subsection: a table of those added, removed or changed."""
    L = ["", "### Integer constants", ""]
    rows = ([(k, "-", v) for k, v in c["added"].items()] + [(k, v, "-") for k, v in c["removed"].items()]
            + [(k, v[0], v[1]) for k, v in c["changed"].items()])
    if rows:
        L += ["| constant | A | B |", "|---|---|---|"] + [f"| `{k}` | {x} | {y} |" for k, x, y in rows]
    else:
        L.append("No constant changed.")
    return L


def _runtime_markdown(rt: dict) -> list[str]:
    """The runtime section: RPC protocol, B's devices beside A's, optional entry points."""
    L = ["", "## Runtime", "",
         f"RPC protocol: {rt['rpc_protocol'][0]} -> {rt['rpc_protocol'][1]}", "",
         "| device | type | caps A | caps B | buffer types (alignment) B |", "|---|---|---|---|---|"]
    da = {d["name"]: d for d in rt["a"]["devices"]}
    for d in rt["b"]["devices"]:
        x = da.get(d["name"], {})
        caps = lambda dd: ", ".join(k for k, v in dd.get("caps", {}).items() if v) or "-"   # noqa: E731
        L.append(f"| {d['name']} | {d['type']} | {caps(x) if x else 'absent'} | {caps(d)} | "
                 + ", ".join(f"{t['name']} ({t['alignment']})" for t in d.get("buffer_types", [])) + " |")
    for d in rt["devices"]["changed"]:
        L.append(f"\n- {d['name']}: " + "; ".join(f"{k} {v}" for k, v in d.items() if k != "name"))
    ext = {k: v for k, v in (rt.get("extensions") or {}).items() if any(v)}
    if ext:
        yn = lambda x: "present" if x else "absent" if x is False else "-"   # noqa: E731
        L += ["", "Optional entry points (the meta device, the backend communicators by proc "
              "address; listed when either side has them):", "",
              "| entry point | A | B |", "|---|---|---|"]
        L += [f"| `{k}` | {yn(v[0])} | {yn(v[1])} |" for k, v in ext.items()]
    return L


def _ops_markdown(rep: dict) -> list[str]:
    """The ops section: how cells run, rule disagreements, a row per cell (over 40 same folded)."""
    L = ["", "## Ops", "",
         f"{len(rep['ops'])} cells (op x type x device). Each cell is built with ggml's own "
         "calls, without ggml_py's rules (the calls ggml_py makes for f32 operands, recorded "
         "and replayed on the cell's types), and run in a crash-isolated worker with the same "
         "seeded inputs on both sides: *computes, matches* (NMSE against numpy within "
         "test-backend-ops' threshold), *computes wrong*, *aborts* (signal and ggml's message), "
         "*unsupported* (the device says so), *hangs*. ggml_py's own rule for the cell is the "
         "last column. Cells that cannot exist (a shape no block size divides) are left out.", ""]
    L += rules_markdown(rep)
    L += ["| verdict | device | op | type | A | B | NMSE A | NMSE B | A vs B | ggml_py rule A / B |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    rows = sorted(rep["ops"], key=lambda r: (VERDICT_ORDER.get(r["verdict"], 9), r["device"], r["op"]))
    n_same = sum(r["verdict"] == "same" for r in rows)
    for r in rows:
        if r["verdict"] == "same" and n_same > 40:
            continue
        L.append(f"| {r['verdict']} | {r['device']} | {r['op']} | {r['type']} | "
                 f"{MEANING.get(r['a']['status'], r['a']['status'])} | "
                 f"{MEANING.get(r['b']['status'], r['b']['status'])} | {_e(r['a'].get('nmse'))} | "
                 f"{_e(r['b'].get('nmse'))} | {_e(r['nmse_ab'])} | "
                 f"{r['a'].get('rule', '-')} / {r['b'].get('rule', '-')} |")
    if n_same > 40:
        L += ["", f"<details><summary>{n_same} cells the same on both sides</summary>", "",
              ", ".join(f"{r['device']} {r['op']} {r['type']} ({MEANING.get(r['b']['status'])})"
                        for r in rows if r["verdict"] == "same"), "", "</details>"]
    return L


def _speed_markdown(rep: dict) -> list[str]:
    """The speed section: how rows are measured and flagged, then a row per (device, op)."""
    sm = rep["speed_meta"]
    L = ["", "## Speed", ""]
    if rep["speed"]:
        L += [f"Median of {sm['rounds']} rounds per side, rounds alternating A and B. Noise "
              f"(relative spread of a row's rounds): median {sm['noise_median'] * 100:.1f}%, max "
              f"{sm['noise_max'] * 100:.1f}%. " + sm.get("method", f"A row is flagged beyond its "
              f"noise (at least {sm['noise_floor'] * 100:.0f}%).") + ".", "",
              "| device | op | A us | B us | B/A | 95% interval | noise | flag |",
              "|---|---|---|---|---|---|---|---|"]
        L += [f"| {r['device']} | {r['op']} | {r['a_us']:.1f} | {r['b_us']:.1f} | {r['ratio']:.2f} | "
              + (f"{r['interval'][0]:.2f}-{r['interval'][1]:.2f}" if r.get("interval") else "-")
              + f" | {r['noise'] * 100:.0f}% | {r['flag'] or ''} |" for r in rep["speed"]]
    else:
        L.append("Not measured.")
    return L


def rules_markdown(rep: dict) -> list[str]:
    dis = rep.get("rule_disagreements")
    if dis is None:
        return []
    L = ["### Where ggml_py's rule and the build disagree", ""]
    if not dis:
        return L + ["None: in every cell tried, ggml_py refuses exactly what the build cannot "
                    "compute right.", ""]
    L += ["| build | device | op | type | rule | the build | detail |", "|---|---|---|---|---|---|---|"]
    for d in dis:
        L.append(f"| {d['build']} | {d['device']} | {d['op']} | {d['type']} | {d['rule']} "
                 f"({d['kind']}) | {MEANING.get(d['status'], d['status'])} | "
                 f"{(d['detail'] or '').replace('|', '/')[:160]} |")
    return L + [""]


def verdict_markdown(rep: dict) -> list[str]:
    v = verdict_of(rep)
    L = ["## What breaks", "",
         f"{len(v['breaking'])} breaking (the regressions: exit status 1), {len(v['changed'])} "
         f"changed, {v['same']['count']} same.", ""]
    L += ["### Breaking", ""]
    L += [f"- **{i['what']}**" + (f"  \n  {i['evidence']}" if i["evidence"] else "")
          for i in v["breaking"]] or ["None."]
    L += ["", "### Changed", ""]
    L += [f"- {i['what']}" + (f" ({i['evidence']})" if i["evidence"] else "")
          for i in v["changed"]] or ["None."]
    L += ["", f"<details><summary>Same: {v['same']['count']}</summary>", "",
          ", ".join(f"{k}: {n}" for k, n in v["same"]["by_kind"].items()), "", "</details>", ""]
    cross = rep["runtime"].get("rpc_cross")
    if cross:
        L += ["### RPC, tried", "", "| client | server | result | where | ggml says |",
              "|---|---|---|---|---|"]
        for c in cross:
            L.append(f"| {c['client']} | {c['server']} | {c.get('outcome')}"
                     f"{' (' + c['signal'] + ')' if c.get('signal') else ''} | "
                     f"{c.get('stage') or '-'} | {(c.get('message') or '-').replace('|', '/')} |")
        L.append("")
    return L


def _svg_speed(rows: list[dict]) -> str:
    """Horizontal bars of log2(B/A) per (device, op), left faster, right slower, with each
    row's 95% interval as a whisker; every label inside the figure (its width is computed
    from the longest label)."""
    if not rows:
        return "<p>Speed not measured.</p>"
    h, bar, ch = 18, 200, 6.5                       # row height, half bar width, px per char
    names = [f"{r['device']} {r['op']}" for r in rows]
    vals = [f"{r['ratio']:.2f}x [{r.get('interval', [r['ratio']] * 2)[0]:.2f}-"
            f"{r.get('interval', [r['ratio']] * 2)[1]:.2f}] noise {r['noise'] * 100:.0f}%"
            + (f" {r['flag']}" if r["flag"] else "") for r in rows]
    left = int(max(len(n) for n in names) * ch) + 16
    right = int(max(len(v) for v in vals) * ch) + 16
    mid = left + bar
    w = left + 2 * bar + right
    lim = max(1.0, max(abs(math.log2(max(r["ratio"], 1e-9))) for r in rows))
    px = lambda ratio: mid + max(-1.0, min(1.0, math.log2(max(ratio, 1e-9)) / lim)) * bar  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * len(rows) + 34}" '
             f'viewBox="0 0 {w} {h * len(rows) + 34}" font-family="sans-serif" font-size="11">',
             f'<line x1="{mid}" y1="0" x2="{mid}" y2="{h * len(rows)}" stroke="#333"/>']
    for i, (r, name, val) in enumerate(zip(rows, names, vals)):
        x1 = px(r["ratio"])
        col = "#e53935" if r["flag"] == "slower" else "#43a047" if r["flag"] == "faster" else "#90a4ae"
        parts.append(f'<text x="{left - 8}" y="{i * h + 13}" text-anchor="end">{html.escape(name)}</text>')
        parts.append(f'<rect x="{min(mid, x1):.1f}" y="{i * h + 4}" width="{abs(x1 - mid):.1f}" '
                     f'height="{h - 8}" fill="{col}"/>')
        if r.get("interval"):
            lo, hi = px(r["interval"][0]), px(r["interval"][1])
            parts.append(f'<line x1="{lo:.1f}" y1="{i * h + 9}" x2="{hi:.1f}" y2="{i * h + 9}" '
                         f'stroke="#000" stroke-width="1"/>')
        parts.append(f'<text x="{mid + bar + 8}" y="{i * h + 13}">{html.escape(val)}</text>')
    parts.append(f'<text x="{mid}" y="{h * len(rows) + 22}" text-anchor="middle">B/A time, log '
                 f'scale (whisker: 95% interval): left faster, right slower</text></svg>')
    return "".join(parts)


def _grid(rep: dict) -> str:
    """The op matrix: a row per op, a column per (device, type); each cell split A | B."""
    cols = sorted({(r["device"], r["type"]) for r in rep["ops"]})
    ops = sorted({r["op"] for r in rep["ops"]})
    idx = {(r["op"], r["device"], r["type"]): r for r in rep["ops"]}
    head = "".join(f"<th>{html.escape(d)}<br>{html.escape(t)}</th>" for d, t in cols)
    body = []
    for op in ops:
        cells = []
        for d, t in cols:
            r = idx.get((op, d, t))
            if r is None:
                cells.append('<td class="n"></td>')
                continue
            sa, sb = r["a"]["status"], r["b"]["status"]
            tip = html.escape(f"{op} {t} on {d}: A {sa} {_e(r['a'].get('nmse'))}, B {sb} "
                              f"{_e(r['b'].get('nmse'))}, A vs B {_e(r['nmse_ab'])}; {r['verdict']}"
                              + (f"; {r['b'].get('error') or r['a'].get('error')}"
                                 if r['b'].get('error') or r['a'].get('error') else ""))
            cls = " reg" if r["verdict"] == "regressed" else ""
            cells.append(f'<td class="c{cls}" title="{tip}"><span style="background:{COLOURS[sa]}"></span>'
                         f'<span style="background:{COLOURS[sb]}"></span></td>')
        body.append(f"<tr><th class=op>{html.escape(op)}</th>{''.join(cells)}</tr>")
    legend = " ".join(f'<span class=lg style="background:{c}"></span>{s}' for s, c in COLOURS.items()
                      if s not in ("absent",))
    return (f"<p>Each cell: left half A, right half B; hover for NMSE and errors; a red frame "
            f"marks a regression.<br>{legend}</p><table class=grid><tr><th></th>{head}</tr>"
            + "".join(body) + "</table>")


def html_page(rep: dict) -> str:
    md = markdown(rep)
    a, b = rep["a"], rep["b"]
    v = verdict_of(rep)
    def li(i):
        ev = f'<br><small>{html.escape(i["evidence"])}</small>' if i["evidence"] else ""
        return f"<li>{html.escape(i['what'])}{ev}</li>"
    brk = "".join(li(i) for i in v["breaking"]) or "<li>None</li>"
    chg = "".join(li(i) for i in v["changed"]) or "<li>None</li>"
    same = html.escape(", ".join(f"{k}: {n}" for k, n in v["same"]["by_kind"].items()))
    regs = (f"<h3 class=brk>Breaking ({len(v['breaking'])})</h3><ul>{brk}</ul>"
            f"<details><summary>Changed ({len(v['changed'])})</summary><ul>{chg}</ul></details>"
            f"<details><summary>Same ({v['same']['count']})</summary><p>{same}</p></details>")
    ident = "".join(f"<br>{k} identity: {html.escape(identity_line(s))}"
                    for k, s in (("A", a), ("B", b)) if identity_line(s))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>ggml {html.escape(a['version'])} vs {html.escape(b['version'])}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1400px; }}
table.grid {{ border-collapse: collapse; font-size: 11px; }}
table.grid th {{ font-weight: normal; padding: 2px 4px; }} th.op {{ text-align: right; }}
td.c {{ width: 22px; height: 14px; padding: 1px; border: 1px solid #fff; }}
td.c span {{ display: inline-block; width: 50%; height: 100%; }}
td.reg {{ border: 2px solid #b71c1c; }}
span.lg {{ display: inline-block; width: 12px; height: 12px; margin: 0 3px 0 10px; border: 1px solid #ccc; }}
h3.brk {{ color: #b71c1c; }}
pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 12px; }}
</style></head><body>
<h1>ggml {html.escape(a['version'])} vs {html.escape(b['version'])}</h1>
<p>A: {html.escape(_side(a))}<br>B: {html.escape(_side(b))}{ident}</p>
<h2>What breaks</h2>{regs}
<h2>Op matrix</h2>{_grid(rep)}
<h3>Where ggml_py's rule and the build disagree</h3><pre>{html.escape(chr(10).join(rules_markdown(rep)[2:]))}</pre>
<h2>Speed</h2>{_svg_speed(rep['speed'])}
<h2>Full report</h2><pre>{html.escape(md)}</pre>
</body></html>
"""
