"""Which build ggml_py loads by default: releases compare as versions, folder names follow the
platform (computed, as build_ggml.py computes them, not literals), and an installed package
(no vendor/releases.toml) loads its wheel's build."""
import pytest

from ggml_build import flags
from ggml_py import _where

NAMES = ["ggml-0.9.4-cpu-rpc", "ggml-0.26.0-cpu-rpc-portable", "ggml-0.15.3-cpu-rpc",
         "ggml-0.26.0-cpu-rpc-cuda90", "ggml-0.20.2-cpu-rpc"]


def test_versions_sort_as_versions():
    assert sorted(["0.26.0", "0.9.4", "0.15.3"], key=_where.version_key) == \
        ["0.9.4", "0.15.3", "0.26.0"]
    assert [n.split("-")[1] for n in sorted(NAMES, key=_where.name_key)] == \
        ["0.9.4", "0.15.3", "0.20.2", "0.26.0", "0.26.0"]


@pytest.mark.parametrize("system", ["Linux", "Darwin", "Windows"])
def test_platform_names_match_the_builder(system):
    plat = flags.Platform(system, nvcc=False, nvidia_gpu=False)
    assert _where.platform_backends(system) == flags.default_backends(plat)
    name = flags.config_name("0.26.0", flags.default_backends(plat))
    assert _where.choose([name, "ggml-0.26.0-cpu-rpc-vulkan"], "0.26.0", system) == name


@pytest.mark.parametrize("system", ["Linux", "Darwin"])
def test_installed_package_loads_the_newest_release(system):
    # no manifest: release None -> the newest as a version (a string sort picked 0.15.3/0.20.2)
    assert _where.choose(NAMES, None, system) == "ggml-0.26.0-cpu-rpc-cuda90"
    assert _where.choose(["ggml-0.9.4-cpu-rpc", "ggml-0.26.0-cpu-rpc"], None, system) == \
        "ggml-0.26.0-cpu-rpc"


def test_a_cpu_rpc_only_build_on_macos_is_found():
    plain = flags.config_name("0.26.0", ("cpu", "rpc"))
    metal = flags.config_name("0.26.0", flags.default_backends(flags.Platform("Darwin", False, False)))
    assert _where.choose([plain], "0.26.0", "Darwin") == plain
    assert _where.choose([plain, metal], "0.26.0", "Darwin") == metal
    assert _where.choose([plain, metal], "0.26.0", "Linux") == plain


def test_extras_fewest_first_portable_last_source_trees_never():
    assert _where.choose(["ggml-0.26.0-cpu-rpc-portable", "ggml-0.26.0-cpu-rpc-cuda90-vulkan",
                          "ggml-0.26.0-cpu-rpc-cuda90"], "0.26.0", "Linux") == \
        "ggml-0.26.0-cpu-rpc-cuda90"
    assert _where.choose(["ggml-0.26.0-cpu-rpc-portable"], "0.26.0", "Linux") == \
        "ggml-0.26.0-cpu-rpc-portable"
    assert _where.choose(["ggml-0.26.0-src1234abcd-cpu-rpc"], None, "Linux") is None
    assert _where.choose(["ggml-0.25.3-cpu-rpc"], "0.26.0", "Linux") is None


def test_available_builds_are_in_version_order():
    names = [p.name for p in _where.available_builds()]
    assert names == sorted(names, key=_where.name_key)
