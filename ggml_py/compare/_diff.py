"""Pure comparisons of two sides' facts (no ggml here): API, runtime, op cells, speed."""
from __future__ import annotations

import base64
import statistics

import numpy as np

from ._cases import nmse


def _sig(f: dict) -> str:
    args = ", ".join(f["args"]) + (", ..." if f.get("variadic") else "")
    return f"{f['result']} ({args or 'void'})"


def functions(a: dict, b: dict) -> dict:
    changed = [{"name": n, "a": _sig(a[n]), "b": _sig(b[n])}
               for n in sorted(set(a) & set(b)) if _sig(a[n]) != _sig(b[n])]
    return {"added": sorted(set(b) - set(a)), "removed": sorted(set(a) - set(b)),
            "changed": changed, "count": {"a": len(a), "b": len(b)}}


def structs(a: dict, b: dict) -> dict:
    changed = []
    for name in sorted(set(a) & set(b)):
        sa, sb = a[name], b[name]
        if sa == sb:
            continue
        entry = {"name": name}
        if sa.get("opaque") or sb.get("opaque"):
            entry["opaque"] = [sa.get("opaque"), sb.get("opaque")]
            changed.append(entry)
            continue
        fa = {f["name"]: f for f in sa["fields"]}
        fb = {f["name"]: f for f in sb["fields"]}
        entry.update({
            "size": [sa["size"], sb["size"]], "align": [sa["align"], sb["align"]],
            "fields_added": [fb[n] for n in fb if n not in fa],
            "fields_removed": [fa[n] for n in fa if n not in fb],
            "fields_retyped": [{"name": n, "a": fa[n]["type"], "b": fb[n]["type"]}
                               for n in fa if n in fb and fa[n]["type"] != fb[n]["type"]],
            "fields_moved": [{"name": n, "a": fa[n]["offset"], "b": fb[n]["offset"]}
                             for n in fa if n in fb and fa[n]["offset"] != fb[n]["offset"]],
        })
        changed.append(entry)
    return {"added": sorted(set(b) - set(a)), "removed": sorted(set(a) - set(b)),
            "changed": changed}


def enums(a: dict, b: dict) -> dict:
    changed = []
    for name in sorted(set(a) & set(b)):
        ea, eb = a[name], b[name]
        if ea == eb:
            continue
        changed.append({
            "name": name,
            "added": {k: v for k, v in eb.items() if k not in ea},
            "removed": {k: v for k, v in ea.items() if k not in eb},
            "moved": {k: [ea[k], eb[k]] for k in ea if k in eb and ea[k] != eb[k]},
        })
    return {"added": sorted(set(b) - set(a)), "removed": sorted(set(a) - set(b)),
            "changed": changed}


def constants(a: dict, b: dict) -> dict:
    return {"added": {k: b[k] for k in sorted(set(b) - set(a))},
            "removed": {k: a[k] for k in sorted(set(a) - set(b))},
            "changed": {k: [a[k], b[k]] for k in sorted(set(a) & set(b)) if a[k] != b[k]}}


def api(a: dict, b: dict) -> dict:
    return {"layout_source": [a["layout_source"], b["layout_source"]],
            "functions": functions(a["functions"], b["functions"]),
            "structs": structs(a["structs"], b["structs"]),
            "enums": enums(a["enums"], b["enums"]),
            "constants": constants(a["constants"], b["constants"])}


def runtime(a: dict, b: dict) -> dict:
    """Both sides' runtime facts and what differs, device by device (joined on the name)."""
    da = {d["name"]: d for d in a["devices"]}
    db = {d["name"]: d for d in b["devices"]}
    changed = []
    for name in [n for n in da if n in db]:
        x, y = da[name], db[name]
        diffs = {}
        for key in ("type", "registry", "description", "memory_total", "host_buffer_type"):
            if x.get(key) != y.get(key):
                diffs[key] = [x.get(key), y.get(key)]
        ca, cb = x.get("caps", {}), y.get("caps", {})
        caps = {k: [ca.get(k), cb.get(k)] for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)}
        if caps:
            diffs["caps"] = caps
        ba = {t["name"]: t for t in x.get("buffer_types", [])}
        bb = {t["name"]: t for t in y.get("buffer_types", [])}
        bt = {"added": [n for n in bb if n not in ba], "removed": [n for n in ba if n not in bb],
              "changed": [{"name": n, "field": f, "a": ba[n][f], "b": bb[n][f]}
                          for n in ba if n in bb for f in ba[n] if ba[n][f] != bb[n].get(f)]}
        if any(bt.values()):
            diffs["buffer_types"] = bt
        if diffs:
            changed.append({"name": name, **diffs})
    ra = {r["name"] for r in a["registries"]}
    rb = {r["name"] for r in b["registries"]}
    rpc_a, rpc_b = a.get("rpc") or {}, b.get("rpc") or {}
    return {
        "a": a, "b": b,
        "registries": {"added": sorted(rb - ra), "removed": sorted(ra - rb)},
        "devices": {"added": [n for n in db if n not in da], "removed": [n for n in da if n not in db],
                    "changed": changed},
        "rpc_protocol": [rpc_a.get("server"), rpc_b.get("server")],
        "extensions": {k: [(a.get("extensions") or {}).get(k), (b.get("extensions") or {}).get(k)]
                       for k in sorted(set(a.get("extensions") or {}) | set(b.get("extensions") or {}))},
    }


OK = "ok"


def ops(cells: list, ra: list[dict], rb: list[dict]) -> list[dict]:
    """One row per cell that either side does not refuse, with a verdict:
    regressed (A passed, B does not, or B newly crashes), improved, differs (both pass but
    A and B disagree beyond the threshold), changed (another non-passing outcome), same."""
    rows = []
    for (dev, op, ty), x, y in zip(cells, ra, rb):
        if x["status"] in ("refused", "absent") and y["status"] in ("refused", "absent"):
            continue
        ab = None
        if x.get("out") and y.get("out"):
            oa = np.frombuffer(base64.b64decode(x["out"]), np.float32)
            ob = np.frombuffer(base64.b64decode(y["out"]), np.float32)
            ab = nmse(ob, oa)
            ab = ab if np.isfinite(ab) else None
        tol = x.get("threshold") or y.get("threshold")
        if x["status"] == OK and y["status"] != OK:
            verdict = "regressed"
        elif y["status"] in ("crash", "timeout") and x["status"] not in ("crash", "timeout"):
            verdict = "regressed"
        elif x["status"] != OK and y["status"] == OK:
            verdict = "improved"
        elif x["status"] == OK and y["status"] == OK:
            verdict = "differs" if ab is None or ab > tol else "same"
        else:
            verdict = "same" if x["status"] == y["status"] else "changed"
        strip = lambda r: {k: v for k, v in r.items() if k != "out"}   # noqa: E731
        rows.append({"device": dev, "op": op, "type": ty, "a": strip(x), "b": strip(y),
                     "nmse_ab": ab, "threshold": tol, "verdict": verdict})
    return rows


WRONG = ("crash", "fail", "timeout", "error")


def rule_disagreements(cells: list, ra: list[dict], rb: list[dict], labels: tuple[str, str]) -> list[dict]:
    """Cells where ggml_py's rule and what the build does disagree, per side: the rule refuses
    what computes right ("too strict"), or allows what aborts, computes wrong, errs or hangs
    ("too loose")."""
    out, seen = [], set()
    for side, label, res in (("a", labels[0], ra), ("b", labels[1], rb)):
        label = label.rstrip("/").rsplit("/", 1)[-1]
        for (dev, op, ty), r in zip(cells, res):
            if (label, dev, op, ty) in seen:       # (the same build on both sides)
                continue
            seen.add((label, dev, op, ty))
            rule = r.get("rule")
            if rule == "refused" and r["status"] == OK:
                kind = "too strict"
            elif rule == "allowed" and r["status"] in WRONG:
                kind = "too loose"
            else:
                continue
            out.append({"side": side, "build": label, "device": dev, "op": op, "type": ty,
                        "kind": kind, "rule": rule, "status": r["status"],
                        "detail": r.get("rule_error") if kind == "too strict" else
                        (r.get("error") or (f"NMSE {r['nmse']:.2e} > {r['threshold']:.0e}"
                                            if r.get("nmse") is not None else ""))})
    return out


def _interval(ta: list[float], tb: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of median(B) / median(A): each side's rounds resampled with
    replacement (seeded: the same report from the same rounds)."""
    rng = np.random.default_rng(seed)
    a = np.asarray(ta, dtype=np.float64)
    b = np.asarray(tb, dtype=np.float64)
    ma = np.median(a[rng.integers(0, len(a), (n, len(a)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), (n, len(b)))], axis=1)
    lo, hi = np.percentile(mb / ma, [2.5, 97.5])
    return float(lo), float(hi)


def speed(rounds_a: list[dict], rounds_b: list[dict], max_slowdown: float | None,
          floor: float = 0.05) -> tuple[list[dict], dict]:
    """Per (device, op): median time of each side over the rounds, B/A, its 95% bootstrap
    interval, and a flag only where the whole interval lies beyond 1 +- `floor` (a
    difference larger than what resampling the same rounds shows, and than 5%). Noise of a
    row: the larger side's relative spread of its rounds ((max - min) / median)."""
    rows, noises = [], []
    keys = [k for k in rounds_a[0] if k in rounds_b[0]] if rounds_a and rounds_b else []
    for key in keys:
        ta = [r[key] for r in rounds_a]
        tb = [r[key] for r in rounds_b]
        ma, mb = statistics.median(ta), statistics.median(tb)
        spread = max((max(ta) - min(ta)) / ma, (max(tb) - min(tb)) / mb)
        noises.append(spread)
        ratio = mb / ma
        lo, hi = _interval(ta, tb) if len(ta) > 1 and len(tb) > 1 else (ratio, ratio)
        flag = "slower" if lo > 1 + floor else "faster" if hi < 1 / (1 + floor) else None
        dev, op = key.split("/", 1)
        rows.append({"device": dev, "op": op, "a_us": ma, "b_us": mb, "ratio": ratio,
                     "interval": [lo, hi], "noise": spread, "flag": flag,
                     "a_rounds_us": ta, "b_rounds_us": tb,
                     "regressed": bool(flag == "slower" and max_slowdown is not None
                                       and lo > max_slowdown)})
    meta = {"rounds": len(rounds_a), "noise_median": statistics.median(noises) if noises else None,
            "noise_max": max(noises) if noises else None, "noise_floor": floor,
            "max_slowdown": max_slowdown,
            "method": "95% bootstrap interval of median(B)/median(A) over the rounds (2000 "
                      "resamples, seeded); flagged when the interval lies wholly beyond 1 +- "
                      "noise_floor; --max-slowdown regresses when the interval's lower end "
                      "exceeds it"}
    return rows, meta


def regressions(report: dict) -> list[str]:
    """What makes the exit status 1, one line each, worst first."""
    out = []
    for r in report["ops"]:
        if r["verdict"] == "regressed":
            why = r["b"].get("error") or (f"NMSE {r['b']['nmse']:.2e} > {r['threshold']:.0e}"
                                          if r["b"].get("nmse") is not None else "")
            out.append(f"op {r['op']} {r['type']} on {r['device']}: {r['a']['status']} -> "
                       f"{r['b']['status']} {why}".rstrip())
    for name in report["api"]["functions"]["removed"]:
        out.append(f"function removed: {name}")
    for r in report["speed"]:
        if r["regressed"]:
            out.append(f"speed {r['op']} on {r['device']}: {r['ratio']:.2f}x slower "
                       f"({r['a_us']:.1f} -> {r['b_us']:.1f} us)")
    return out
