"""What breaks: every difference of a report as one item with a severity, worst first.

- **breaking**: what makes code or a deployment built for A fail on B: a function removed or
  retyped, a struct whose size, field types or offsets changed, an enum value renumbered or
  removed (a ``*_COUNT`` sentinel moving because values were added is *changed*), an RPC
  client of one side that cannot use a server of the other (tried, both directions; a major
  protocol bump when it was not tried), a registry, device, buffer type or cap gone, an op
  cell that computed right on A and on B aborts, computes wrong, errs or hangs, a
  test-backend-ops case that stopped passing, a speed regression beyond ``--max-slowdown``.
- **changed**: additions (functions, structs, enum values, devices, caps), a minor protocol
  bump, constants, op cells whose numbers drifted (within or beyond the threshold while both
  pass) or that improved, speed beyond the noise.
- **same**: counted, not listed.

Breaking items are the regressions: they make the exit status 1.
"""
from __future__ import annotations


def _item(sev: str, kind: str, what: str, evidence: str = "") -> dict:
    return {"severity": sev, "kind": kind, "what": what, "evidence": evidence}


def _major(v: str | None) -> int | None:
    try:
        return int(str(v).split(".")[0])
    except ValueError:
        return None


def _rpc(rep: dict, items: list[dict], same: dict) -> None:
    rt = rep["runtime"]
    pa, pb = rt["rpc_protocol"]
    cross = rt.get("rpc_cross") or []
    tried = [c for c in cross if c["roles"][0] != c["roles"][1]]
    controls_ok = all(c.get("talks") for c in cross if c["roles"][0] == c["roles"][1])
    proto = f"RPC protocol {pa} -> {pb}"
    if tried:
        bad = [c for c in tried if not c.get("talks")]
        ev = "; ".join(_cross_line(c) for c in cross)
        if bad and controls_ok:
            items.append(_item("breaking", "rpc", f"{proto}: " + ", ".join(
                f"a {c['client']} client cannot use a {c['server']} server" for c in bad), ev))
        elif bad:
            items.append(_item("changed", "rpc", f"{proto}: cross connections fail, but so does "
                               "a side against itself (no verdict on the protocol)", ev))
        elif pa != pb:
            items.append(_item("changed", "rpc", f"{proto}: clients and servers of both sides "
                               "talk (both directions)", ev))
        else:
            same["rpc"] = 1
        return
    if pa is None or pb is None:
        if pa != pb:
            items.append(_item("breaking" if pb is None else "changed", "rpc",
                               f"RPC backend {'gone' if pb is None else 'added'}: {proto}",
                               "cross connection not tried: one side has no RPC server"))
        return
    if pa == pb:
        same["rpc"] = 1
    elif _major(pa) != _major(pb):
        items.append(_item("breaking", "rpc", f"{proto} (major bump: ggml's client refuses a "
                           "server of another major version)", "cross connection not tried"))
    else:
        items.append(_item("changed", "rpc", f"{proto} (minor bump)", "cross connection not tried"))


def _cross_line(c: dict) -> str:
    head = f"client {c['client']} -> server {c['server']}: "
    if c.get("talks"):
        return head + "talks (an add computed over RPC matched)"
    bits = [c.get("outcome", "?")]
    if c.get("signal"):
        bits.append(c["signal"])
    if c.get("stage"):
        bits.append(f"at '{c['stage']}'")
    if c.get("message"):
        bits.append(f"ggml: {c['message']}")
    if c.get("hello_error"):
        bits.append(f"(ggml_py's HELLO check: {c['hello_error'].split(':', 1)[0]})")
    return head + " ".join(bits)


def _api(rep: dict, items: list[dict], same: dict) -> None:
    api = rep["api"]
    f = api["functions"]
    for n in f["removed"]:
        items.append(_item("breaking", "function", f"function removed: {n}"))
    for c in f["changed"]:
        items.append(_item("breaking", "function", f"function retyped: {c['name']}",
                           f"{c['a']} -> {c['b']}"))
    if f["added"]:
        items.append(_item("changed", "function", f"{len(f['added'])} function(s) added",
                           ", ".join(f["added"][:20]) + (" ..." if len(f["added"]) > 20 else "")))
    same["functions"] = f["count"]["a"] - len(f["removed"]) - len(f["changed"])
    st = {"added": [], "removed": [], **api["structs"]}
    for n in st["removed"]:
        items.append(_item("breaking", "struct", f"struct removed: {n}"))
    for s in st["changed"]:
        if "opaque" in s:
            sev = "breaking" if s["opaque"][1] and not s["opaque"][0] else "changed"
            items.append(_item(sev, "struct", f"{s['name']}: opaque {s['opaque'][0]} -> {s['opaque'][1]}"))
            continue
        layout = (s["size"][0] != s["size"][1] or s["fields_removed"] or s["fields_retyped"]
                  or s["fields_moved"])
        from ._report import _struct_line
        items.append(_item("breaking" if layout else "changed", "struct",
                           f"struct layout changed: {s['name']}" if layout else
                           f"struct fields added: {s['name']}", _struct_line(s)))
    if st["added"]:
        items.append(_item("changed", "struct", f"{len(st['added'])} struct(s) added",
                           ", ".join(st["added"][:20])))
    en = {"added": [], "removed": [], **api["enums"]}
    for n in en["removed"]:
        items.append(_item("breaking", "enum", f"enum removed: {n}"))
    for e in en["changed"]:
        moved = {k: v for k, v in e["moved"].items() if not k.endswith("_COUNT")}
        sentinel = {k: v for k, v in e["moved"].items() if k.endswith("_COUNT")}
        if moved or e["removed"]:
            ev = ", ".join([f"{k} {v[0]}->{v[1]}" for k, v in list(moved.items())[:8]]
                           + [f"-{k}" for k in e["removed"]])
            items.append(_item("breaking", "enum", f"enum values renumbered or removed: "
                               f"{e['name']} ({len(moved)} moved, {len(e['removed'])} removed)", ev))
        if e["added"] or sentinel:
            items.append(_item("changed", "enum", f"enum values added: {e['name']}",
                               ", ".join([f"+{k}={v}" for k, v in e["added"].items()]
                                         + [f"{k} {v[0]}->{v[1]}" for k, v in sentinel.items()])))
    c = {"changed": {}, "removed": {}, **api["constants"]}
    other = {k: v for k, v in c["changed"].items() if not k.startswith("RPC_PROTO_")}
    if other or c["removed"]:
        items.append(_item("changed", "constant", f"{len(other)} constant(s) changed, "
                           f"{len(c['removed'])} removed",
                           ", ".join([f"{k} {v[0]}->{v[1]}" for k, v in other.items()]
                                     + [f"-{k}" for k in c["removed"]])))


def _runtime(rep: dict, items: list[dict], same: dict) -> None:
    rt = rep["runtime"]
    rt.setdefault("registries", {"added": [], "removed": []})
    for n in rt["registries"]["removed"]:
        items.append(_item("breaking", "device", f"backend registry gone: {n}"))
    for n in rt["registries"]["added"]:
        items.append(_item("changed", "device", f"backend registry added: {n}"))
    for n in rt["devices"]["removed"]:
        items.append(_item("breaking", "device", f"device gone: {n}"))
    for n in rt["devices"]["added"]:
        items.append(_item("changed", "device", f"device added: {n}"))
    for d in rt["devices"]["changed"]:
        lost = [k for k, (x, y) in d.get("caps", {}).items() if x and not y]
        gained = [k for k, (x, y) in d.get("caps", {}).items() if y and not x]
        if lost:
            items.append(_item("breaking", "device", f"{d['name']}: cap(s) lost: {', '.join(lost)}"))
        if gained:
            items.append(_item("changed", "device", f"{d['name']}: cap(s) gained: {', '.join(gained)}"))
        bt = d.get("buffer_types") or {}
        for n in bt.get("removed", []):
            items.append(_item("breaking", "device", f"{d['name']}: buffer type gone: {n}"))
        rest = {k: v for k, v in d.items() if k not in ("name", "caps", "buffer_types")}
        if rest or bt.get("added") or bt.get("changed"):
            items.append(_item("changed", "device", f"{d['name']}: "
                               + ", ".join(list(rest) + (["buffer types"] if bt else [])) + " changed",
                               "; ".join(f"{k} {v}" for k, v in rest.items())))
    ext = rt.get("extensions")
    if ext:
        for name, (x, y) in ext.items():
            if x and not y:
                items.append(_item("breaking", "extension", f"gone: {name}",
                                   "looked up by dlsym / ggml_backend_reg_get_proc_address"))
            elif y and not x:
                items.append(_item("changed", "extension", f"added: {name}",
                                   "looked up by dlsym / ggml_backend_reg_get_proc_address"))
            else:
                same["extensions"] = same.get("extensions", 0) + 1
    same["devices"] = len((rt.get("b") or {}).get("devices", [])) - len(rt["devices"]["added"]) \
        - len(rt["devices"]["changed"])


def _ops(rep: dict, items: list[dict], same: dict) -> None:
    n_same = 0
    for r in rep["ops"]:
        v = r["verdict"]
        a, b = r["a"], r["b"]
        cell = f"op {r['op']} {r['type']} on {r['device']}"
        trans = f"{a['status']} -> {b['status']}"
        why = b.get("error") or (f"NMSE {b['nmse']:.2e} > {r['threshold']:.0e}"
                                 if b.get("nmse") is not None and r.get("threshold") else "")
        if v == "regressed":
            items.append(_item("breaking", "op", f"{cell}: {trans}", why))
        elif v in ("changed", "improved"):
            items.append(_item("changed", "op", f"{cell}: {trans}", why))
        elif v == "differs":
            items.append(_item("changed", "op", f"{cell}: both compute right, A and B differ "
                               f"(NMSE A vs B {r['nmse_ab'] if r['nmse_ab'] is not None else 'n/a'})"))
        else:
            n_same += 1
    same["op cells"] = n_same
    for r in rep["speed"]:
        what = (f"speed {r['op']} on {r['device']}: {r['ratio']:.2f}x "
                f"({r['a_us']:.1f} -> {r['b_us']:.1f} us)")
        ev = f"noise {r['noise'] * 100:.0f}%"
        if r.get("interval"):
            ev = f"95% interval of B/A {r['interval'][0]:.2f}..{r['interval'][1]:.2f}, " + ev
        if r["regressed"]:
            items.append(_item("breaking", "speed", what + f" slower, beyond --max-slowdown", ev))
        elif r["flag"]:
            items.append(_item("changed", "speed", what + f" {r['flag']}", ev))
        else:
            same["speed rows"] = same.get("speed rows", 0) + 1
    bo = rep.get("backend_ops") or {}
    for k in bo.get("stopped_passing", []):
        items.append(_item("breaking", "test-backend-ops", f"test-backend-ops stopped passing: {k}"))
    if bo.get("vanished") or bo.get("appeared") or bo.get("started_passing"):
        items.append(_item("changed", "test-backend-ops", bo.get("summary", "")))


ORDER = {"breaking": 0, "changed": 1}


def verdict(rep: dict) -> dict:
    items: list[dict] = []
    same: dict = {}
    _rpc(rep, items, same)
    _api(rep, items, same)
    _runtime(rep, items, same)
    _ops(rep, items, same)
    items.sort(key=lambda i: ORDER[i["severity"]])
    return {"breaking": [i for i in items if i["severity"] == "breaking"],
            "changed": [i for i in items if i["severity"] == "changed"],
            "same": {"count": sum(same.values()), "by_kind": same}}


def regressions(v: dict) -> list[str]:
    return [i["what"] + (f" [{i['evidence']}]" if i["evidence"] and i["kind"] == "rpc" else "")
            for i in v["breaking"]]
