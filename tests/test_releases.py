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


OLD = ROOT / "ggml_py" / "lib" / "ggml-0.20.2-cpu-rpc"


@pytest.mark.slow
def test_rpc_servers_of_another_release_raise_instead_of_aborting():
    import ggml_py as gg
    if not (OLD / "build.json").exists():
        pytest.skip("needs the 0.20.2 build of the test above")
    with gg.rpc.serve(build=OLD.name) as old_server:
        with pytest.raises(gg.RPCVersionError, match=r"speaks protocol 5\.0\.0.*7\.0\.0"):
            gg.rpc.connect(old_server.endpoint, timeout=5)
    # and the other way round: a 0.20.2 client meeting a 0.25.3 server
    with gg.rpc.serve() as new_server:
        code = (f"import ggml_py as gg\ntry:\n    gg.rpc.connect({new_server.endpoint!r})\n"
                f"except gg.RPCVersionError as e:\n    print('refused', e)\n")
        env = dict(os.environ, GGML_PY_BUILD=str(OLD))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("refused"), r.stderr[-2000:]
    assert "speaks protocol 7.0.0" in r.stdout
