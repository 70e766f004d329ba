"""A second pinned release builds into its own folder and loads side by side with the default
one, each in its own process (how a regression run picks a release)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBE = ("import ggml_py as gg, json; from ggml_py.__main__ import matmul_check;"
         "print(json.dumps({'version': gg.ggml_version(), 'folder': str(gg.BUILD_DIR),"
         " 'devices': [d.name for d in gg.devices()],"
         " 'nmse': matmul_check(gg.device('CPU'))}))")


def load(build_dir):
    env = dict(os.environ)
    if build_dir:
        env["GGML_PY_BUILD"] = str(build_dir)
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_0_20_2_builds_and_loads_beside_0_25_3():
    r = subprocess.run([sys.executable, str(ROOT / "build_ggml.py"), "--ggml", "0.20.2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    folder = Path(r.stdout.strip().splitlines()[-1])
    assert folder.name == "ggml-0.20.2-cpu-rpc"
    old, new = load(folder), load(None)
    assert old["version"] == "0.20.2" and new["version"] == "0.25.3"
    assert old["folder"] != new["folder"]
    assert old["devices"][0] == new["devices"][0] == "CPU"
    assert old["nmse"] < 5e-4 and new["nmse"] < 5e-4
    # selecting by folder name (under ggml_py/lib) works as well as by path
    assert load(folder.name)["version"] == "0.20.2"
