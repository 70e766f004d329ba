"""Upstream's test-backend-ops, run on each side (builds made with ``--with-tests``) with
``--output sql``, joined on (backend, op, params)."""
from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from ._sides import Side, child_env


def binary(side: Side) -> Path | None:
    p = side.folder / "bin" / "test-backend-ops"
    return p if p.exists() else None


def run(side: Side, mode: str, ops: str | None, timeout: float) -> list[dict]:
    cmd = [str(binary(side)), mode, "--output", "sql"]
    if ops:
        cmd += ["-o", ops]
    r = subprocess.run(cmd, env=child_env(side), capture_output=True, text=True, timeout=timeout)
    db = sqlite3.connect(":memory:")
    sql = "\n".join(ln for ln in r.stdout.splitlines()
                    if ln.startswith(("CREATE", "INSERT", "  ", ")")))
    try:
        db.executescript(sql)
        cur = db.execute("SELECT backend_name, op_name, op_params, supported, passed, time_us "
                         "FROM test_backend_ops")
    except sqlite3.Error:
        return []
    return [dict(zip(("backend", "op", "params", "supported", "passed", "time_us"), row))
            for row in cur]


def join(ra: list[dict], rb: list[dict]) -> dict:
    key = lambda r: f"{r['backend']} {r['op']}({r['params']})"   # noqa: E731
    a = {key(r): r for r in ra}
    b = {key(r): r for r in rb}
    good = lambda r: bool(int(r["passed"] or 0)) if r["passed"] not in (None, "") else bool(int(r["supported"] or 0))  # noqa: E731
    both = [k for k in a if k in b]
    out = {"cases": {"a": len(a), "b": len(b)},
           "appeared": sorted(k for k in b if k not in a),
           "vanished": sorted(k for k in a if k not in b),
           "started_passing": sorted(k for k in both if not good(a[k]) and good(b[k])),
           "stopped_passing": sorted(k for k in both if good(a[k]) and not good(b[k]))}
    out["summary"] = (f"{len(a)} -> {len(b)} cases; appeared {len(out['appeared'])}, vanished "
                      f"{len(out['vanished'])}, started passing {len(out['started_passing'])}, "
                      f"stopped passing {len(out['stopped_passing'])}")
    return out
