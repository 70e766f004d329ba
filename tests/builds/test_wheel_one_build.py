"""A wheel carries exactly the build its pip run made, whatever else is in ggml_py/lib/, and the
installed package (no source tree) loads that build.

The tree gets a second release (0.20.2) beside the default; `pip wheel .` then builds the
default release's wheel. It used to pack every folder under lib/ and load the alphabetically
first one (0.20.2, "ggml-0.20.2" < "ggml-0.26.0").
"""
import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from support import skip_without_index

from ggml_build import pins

ROOT = Path(__file__).resolve().parents[2]
DEFAULT, _ = pins.load_manifest()
OTHER = "0.20.2"


def _build(release: str) -> Path:
    r = subprocess.run([sys.executable, "build_ggml.py", "--ggml", release], cwd=ROOT,
                       capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        skip_without_index(out, f"building ggml {release}")
    assert r.returncode == 0, out[-3000:]
    return Path(r.stdout.strip().splitlines()[-1])


def lib_folders(wheel: Path) -> set[str]:
    """The build folders (ggml_py/lib/<name>/) a wheel holds."""
    with zipfile.ZipFile(wheel) as z:
        return {n.split("/")[2] for n in z.namelist()
                if n.startswith("ggml_py/lib/") and n.count("/") >= 3}


def installed_version(wheel: Path, tmp: Path) -> dict:
    """Install `wheel` into a fresh venv and ask it, from outside the source tree, which
    release it loads and from where."""
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    # numpy and cffi come from the running interpreter's site-packages (no download), after
    # the venv's own: the package under test is the venv's
    site = subprocess.run([sys.executable, "-c", "import numpy, cffi, os; print(os.pathsep.join("
                           "sorted({os.path.dirname(os.path.dirname(m.__file__)) for m in "
                           "(numpy, cffi)})))"], capture_output=True, text=True).stdout.strip()
    code = ("import json, ggml_py, ggml_py._loader as L; print(json.dumps({'version': "
            "ggml_py.ggml_version(), 'folder': str(L.BUILD_DIR), 'file': ggml_py.__file__}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_PY", "PYTHON"))}
    r = subprocess.run([str(py), "-c", f"import sys; sys.path.append({site!r}); {code}"],
                       cwd=tmp, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_wheel_holds_and_loads_only_the_build_it_made(tmp_path):
    other = _build(OTHER)
    assert (other / "build.json").exists()
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist),
                        str(ROOT)], capture_output=True, text=True, timeout=1800,
                       env={k: v for k, v in os.environ.items() if k != "GGML_PY_BUILD_ARGS"})
    out = r.stdout + r.stderr
    if r.returncode != 0:
        skip_without_index(out, "pip wheel's isolated build environment")
    assert r.returncode == 0, out[-3000:]
    (wheel,) = dist.glob("*.whl")
    want = f"ggml-{DEFAULT}-" + ("cpu-rpc-metal" if sys.platform == "darwin" else "cpu-rpc")
    assert lib_folders(wheel) == {want}, sorted(lib_folders(wheel))
    got = installed_version(wheel, tmp_path)
    assert got["version"] == DEFAULT, got
    assert Path(got["folder"]).name == want and str(ROOT) not in got["file"], got
