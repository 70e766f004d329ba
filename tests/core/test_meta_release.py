"""gg.meta_device on releases before 0.26.0: UnsupportedError naming the release it needs.
Runs on every build: on 0.26.0 the older cases are faked in a child process; on an older
build the real refusal is checked."""
import subprocess
import sys

import pytest

import ggml_py as gg
from support import child_env
from support.meta_models import meta_supported


@pytest.mark.parametrize("fake,says", [
    ("_meta.available = lambda: False", "which has none (ggml added them in 0.10.1)"),
    ("gg.ggml_version = lambda: '0.25.3'", "whose meta device ggml_py does not check"),
])
def test_older_release_says_which_release_it_needs(fake, says):
    """Builds without the meta device (0.9.4), or with one whose split rules ggml_py does not
    replay (0.10.1-0.25.3, measured with those builds): UnsupportedError naming 0.26.0."""
    code = (f"import ggml_py as gg\nfrom ggml_py import _meta\n{fake}\n"
            "try:\n    gg.meta_device(['CPU'], {})\nexcept gg.UnsupportedError as e:\n"
            "    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(), timeout=120)
    assert "ERR meta devices (tensor parallelism) need ggml 0.26.0" in out.stdout, out.stderr
    assert says in out.stdout


@pytest.mark.skipif(meta_supported(), reason="this build offers meta devices")
def test_this_older_build_refuses():
    with pytest.raises(gg.UnsupportedError, match="need ggml 0.26.0 or later; this build is"):
        gg.meta_device(["CPU"], {})
