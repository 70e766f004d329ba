"""A second pinned release builds into its own folder and loads side by side with the default
one, each in its own process (how a regression run picks a release)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import RELEASE as RELEASE_LOADED, child_env, skip_without_index
from ggml_build.flags import Platform, config_name, default_backends

ROOT = Path(__file__).resolve().parents[2]
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
    import ggml_py as gg
    another_release(gg)
    r = subprocess.run([sys.executable, str(ROOT / "build_ggml.py"), "--ggml", "0.20.2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if r.returncode:
        skip_without_index(r.stderr, "building 0.20.2")
    assert r.returncode == 0, r.stderr[-3000:]
    folder = Path(r.stdout.strip().splitlines()[-1])
    assert folder.name == OLD.name
    old, new = load(folder), load(None)
    assert old["version"] == "0.20.2" and new["version"] == gg.ggml_version() != "0.20.2"
    assert old["folder"] != new["folder"]
    assert old["devices"][0] == first_device(DEFAULT_BACKENDS, "0.20.2")
    assert new["devices"][0] == first_device(tuple(gg.BUILD["backends"]), gg.ggml_version())
    assert "CPU" in old["devices"] and "CPU" in new["devices"]
    assert old["nmse"] < 5e-4 and new["nmse"] < 5e-4
    # selecting by folder name (under ggml_py/lib) works as well as by path
    assert load(folder.name)["version"] == "0.20.2"


def first_device(backends: tuple[str, ...], release: str) -> str:
    """The first device ggml lists for a build of `backends`: ggml's registry puts the GPU
    backends before the CPU (CUDA, then Metal, then Vulkan); Metal's device was "Metal"
    before its virtual devices arrived in 0.9.7."""
    ver = tuple(int(p) for p in release.split(".")[:3] if p.isdigit())
    for b, name in (("cuda", "CUDA0"), ("metal", "MTL0" if ver >= (0, 9, 7) else "Metal"),
                    ("vulkan", "Vulkan0")):
        if b in backends:
            return name
    return "CPU"


#: what `build_ggml.py --ggml 0.20.2` builds on this platform (the folder is named after it:
#: ggml-0.20.2-cpu-rpc here, ggml-0.20.2-cpu-rpc-metal on macOS)
DEFAULT_BACKENDS = default_backends(Platform.detect())
OLD = ROOT / "ggml_py" / "lib" / config_name("0.20.2", DEFAULT_BACKENDS)


def another_release(gg):
    """These tests pair 0.20.2 with the loaded build: skip when that is 0.20.2 itself."""
    if gg.ggml_version() == "0.20.2":
        pytest.skip("the loaded build is 0.20.2 itself")


@pytest.fixture(scope="module")
def old_build():
    """The 0.20.2 build, made here when no test made it yet (the suite runs shuffled, so the
    test that builds it may come later)."""
    if not (OLD / "build.json").exists():
        r = subprocess.run([sys.executable, str(ROOT / "build_ggml.py"), "--ggml", "0.20.2"],
                           cwd=ROOT, capture_output=True, text=True, timeout=1200)
        if r.returncode:
            skip_without_index(r.stderr, "building 0.20.2")
        assert r.returncode == 0, r.stderr[-3000:]
    return OLD


@pytest.mark.slow
def test_rpc_servers_of_another_release_raise_instead_of_aborting(old_build):
    import ggml_py as gg
    another_release(gg)
    ours = ".".join(str(getattr(gg.lib, f"RPC_PROTO_{p}_VERSION")) for p in ("MAJOR", "MINOR", "PATCH"))
    with gg.rpc.serve(build=OLD.name) as old_server:
        with pytest.raises(gg.RPCVersionError, match=rf"speaks protocol 5\.0\.0.*{re.escape(ours)}"):
            gg.rpc.connect(old_server.endpoint, timeout=5)
    # and the other way round: a 0.20.2 client meeting a 0.25.3 server
    with gg.rpc.serve() as new_server:
        code = (f"import ggml_py as gg\ntry:\n    gg.rpc.connect({new_server.endpoint!r})\n"
                f"except gg.RPCVersionError as e:\n    print('refused', e)\n")
        env = dict(os.environ, GGML_PY_BUILD=str(OLD))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("refused"), r.stderr[-2000:]
    assert f"speaks protocol {ours}" in r.stdout


PLUGIN_TESTS = '''
import ggml_py as gg


def test_the_fixture_names_the_loaded_release(ggml_release):
    assert ggml_release == gg.ggml_version()
    assert ggml_release >= (0, 9) and ggml_release < "99.0.0"


def test_aborts_on_releases_before_0_21(ggml_release):
    if ggml_release < (0, 21):
        gg.lib.ggml_abort(b"test_x.py", 1, b"%s", gg.ffi.new("char[]", b"deliberate abort"))


def test_after_the_abort():
    assert gg.device("CPU").name == "CPU"
'''


def _plugin_args() -> list[str]:
    """`-p ggml_py.pytest_plugin` unless the installed entry point loads it already."""
    from importlib.metadata import entry_points
    installed = any(ep.value == "ggml_py.pytest_plugin" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "ggml_py.pytest_plugin"]


@pytest.mark.slow
def test_pytest_plugin_runs_each_release_in_its_own_process_and_survives_an_abort(tmp_path,
                                                                                  old_build):
    import ggml_py as gg
    another_release(gg)
    (tmp_path / "test_x.py").write_text(PLUGIN_TESTS)
    env = child_env()
    env.pop("GGML_PY_BUILD", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        *_plugin_args(), "--ggml-releases", f"{OLD},{gg.BUILD_DIR}", "test_x.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout
    assert r.returncode == 1, out[-3000:] + r.stderr[-2000:]
    summary = out[out.index("ggml releases"):]
    # the abort is one failed test of 0.20.2; the test after it still ran, in a new process
    # (in whatever order the tests ran: the two others passed, in the first run or the next)
    assert (f"ggml {OLD}: failed (exit 1), 1 test(s) crashed the process "
            "(2 passed, 0 failed, 0 skipped)") in summary
    assert "CRASHED test_x.py::test_aborts_on_releases_before_0_21 (SIGABRT)" in summary
    assert "run 2 after a crash" in out
    if RELEASE_LOADED < (0, 21):     # (the loaded build older still, e.g. 0.9.4: it aborts too)
        assert (f"ggml {gg.BUILD_DIR}: failed (exit 1), 1 test(s) crashed the process "
                "(2 passed, 0 failed, 0 skipped)") in summary
    else:
        assert f"ggml {gg.BUILD_DIR}: passed (3 passed, 0 failed, 0 skipped)" in summary


@pytest.mark.parametrize("system,backends,release,folder,first", [
    ("Linux", None, "0.20.2", "ggml-0.20.2-cpu-rpc", "CPU"),
    ("Darwin", None, "0.20.2", "ggml-0.20.2-cpu-rpc-metal", "MTL0"),
    ("Darwin", None, "0.9.4", "ggml-0.9.4-cpu-rpc-metal", "Metal"),
    ("Linux", "cuda", "0.25.3", "ggml-0.25.3-cpu-rpc-cuda", "CUDA0"),
])
def test_release_expectations_follow_the_platform(system, backends, release, folder, first):
    """What the release tests expect, computed for another platform (issue 33: on macOS the
    0.20.2 folder is ...-cpu-rpc-metal and MTL0 comes first; before 0.9.7 Metal's device
    is "Metal")."""
    plat = Platform(system, nvcc=backends == "cuda", nvidia_gpu=backends == "cuda")
    chosen = default_backends(plat)
    assert config_name(release, chosen) == folder
    assert first_device(chosen, release) == first


def test_the_loaded_build_lists_its_first_device_as_expected():
    import ggml_py as gg
    assert gg.devices()[0].name == first_device(tuple(gg.BUILD["backends"]), gg.ggml_version())
