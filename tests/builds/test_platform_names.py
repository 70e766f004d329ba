"""The loader's names per platform (issue 33), with the platform substituted: what a build
produces on macOS (.dylib libraries, .so backend modules, @loader_path rpaths) is what
build_ggml.py collects and what the bindings link."""
import pytest

import build_ggml
from ggml_build import bindings
from ggml_build.flags import Platform, library_suffix, rpath_origin

LINUX = Platform("Linux", nvcc=False, nvidia_gpu=False)
MAC = Platform("Darwin", nvcc=False, nvidia_gpu=False)


@pytest.mark.parametrize("plat", [LINUX, MAC], ids=lambda p: p.system)
def test_the_libraries_of_a_build_are_collected_and_linked(plat):
    suffix = library_suffix(plat)
    for stem in ("ggml", "ggml-base", "ggml-cpu", "ggml-rpc", "ggml-metal"):
        name = f"lib{stem}{suffix}"
        assert build_ggml._LIB.match(name), name                 # collected by build_ggml.py
        assert bindings._link_name(build_ggml.Path(name)) == stem  # linked as -l<stem>
    assert not build_ggml._LIB.match(f"libggml{suffix}.0")       # no versioned names


def test_platform_facts():
    assert library_suffix(MAC) == ".dylib" and library_suffix(LINUX) == ".so"
    assert rpath_origin(MAC) == "@loader_path" and rpath_origin(LINUX) == "$ORIGIN"
