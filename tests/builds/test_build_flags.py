"""Backend selection per platform, as pure logic."""
import pytest

from ggml_build import BuildError
from ggml_build.flags import Platform, cmake_flags, config_name, default_backends, parse_backends

LINUX = Platform("Linux", nvcc=False, nvidia_gpu=False)
LINUX_NVCC_NO_GPU = Platform("Linux", nvcc=True, nvidia_gpu=False)
LINUX_GPU = Platform("Linux", nvcc=True, nvidia_gpu=True)
MAC = Platform("Darwin", nvcc=False, nvidia_gpu=False)


def test_cpu_and_rpc_always():
    for p in (LINUX, LINUX_NVCC_NO_GPU, LINUX_GPU, MAC):
        assert default_backends(p)[:2] == ("cpu", "rpc")


def test_macos_gets_metal_with_embedded_library():
    assert default_backends(MAC) == ("cpu", "rpc", "metal")
    f = cmake_flags(default_backends(MAC), MAC)
    assert f["GGML_METAL"] == "ON" and f["GGML_METAL_EMBED_LIBRARY"] == "ON"
    assert f["CMAKE_INSTALL_RPATH"] == "@loader_path"


def test_nvcc_with_visible_gpu_gets_cuda():
    assert default_backends(LINUX_GPU) == ("cpu", "rpc", "cuda")
    f = cmake_flags(default_backends(LINUX_GPU), LINUX_GPU, cuda_arch="90")
    assert f["GGML_CUDA"] == "ON" and f["CMAKE_CUDA_ARCHITECTURES"] == "90"


def test_nvcc_without_gpu_gets_no_cuda():
    assert default_backends(LINUX_NVCC_NO_GPU) == ("cpu", "rpc")
    assert cmake_flags(default_backends(LINUX_NVCC_NO_GPU), LINUX_NVCC_NO_GPU)["GGML_CUDA"] == "OFF"


def test_linux_defaults():
    f = cmake_flags(default_backends(LINUX), LINUX)
    assert f["GGML_NATIVE"] == "OFF" and f["BUILD_SHARED_LIBS"] == "ON" and f["GGML_RPC"] == "ON"
    assert f["GGML_BUILD_TESTS"] == "OFF" and f["GGML_BUILD_EXAMPLES"] == "OFF"
    assert f["CMAKE_INSTALL_RPATH"] == "$ORIGIN" and f["GGML_METAL"] == "OFF"
    assert cmake_flags(("cpu", "rpc"), LINUX, native=True)["GGML_NATIVE"] == "ON"


def test_vulkan_only_when_asked():
    assert "vulkan" not in default_backends(LINUX_GPU)
    assert parse_backends("vulkan", LINUX) == ("cpu", "rpc", "vulkan")
    assert cmake_flags(("cpu", "rpc", "vulkan"), LINUX)["GGML_VULKAN"] == "ON"


def test_backends_are_normalised_and_checked():
    assert parse_backends(" CUDA , cpu", LINUX) == ("cpu", "rpc", "cuda")
    assert parse_backends(None, MAC) == ("cpu", "rpc", "metal")
    with pytest.raises(BuildError, match="unknown backend"):
        parse_backends("cpu,opencl2", LINUX)
    with pytest.raises(BuildError, match="macOS"):
        parse_backends("metal", LINUX)


def test_output_folders_differ_per_release_and_configuration():
    names = {config_name("0.25.3", ("cpu", "rpc")), config_name("0.20.2", ("cpu", "rpc")),
             config_name("0.25.3", ("cpu", "rpc", "cuda"), cuda_arch="90"),
             config_name("0.25.3", ("cpu", "rpc"), native=True),
             config_name("0.25.3", ("cpu", "rpc"), source="/a"),
             config_name("0.25.3", ("cpu", "rpc"), source="/b")}
    assert len(names) == 6
    assert config_name("0.25.3", ("cpu", "rpc")) == "ggml-0.25.3-cpu-rpc"


PLATFORMS = (LINUX, LINUX_GPU, MAC)


@pytest.mark.parametrize("plat", PLATFORMS, ids=lambda p: p.system + ("-gpu" if p.nvidia_gpu else ""))
def test_rpaths_use_the_platform_loaders_token(plat):
    """Every rpath a build writes (the libraries' and test-backend-ops') is relative to the
    binary through the token of the platform's loader: dyld ignores ``$ORIGIN`` (issue 33)."""
    from ggml_build import cmake
    from ggml_build.flags import rpath_origin
    token = rpath_origin(plat)
    other = "$ORIGIN" if plat.system == "Darwin" else "@loader_path"
    assert token == ("@loader_path" if plat.system == "Darwin" else "$ORIGIN")
    assert cmake_flags(default_backends(plat), plat)["CMAKE_INSTALL_RPATH"] == token
    text = cmake.wrapper_text(plat)
    rpaths = [line for line in text.splitlines() if "RPATH" in line]
    assert rpaths and all(f"{token}/.." in line for line in rpaths)
    assert other not in text


@pytest.mark.parametrize("plat", PLATFORMS, ids=lambda p: p.system + ("-gpu" if p.nvidia_gpu else ""))
def test_no_apple_blas_device(plat):
    """ggml builds an Apple Accelerate BLAS device by default on macOS; ggml_py turns it off
    on every platform, so a Mac's device list is the Linux one plus MTL (issue 33)."""
    assert cmake_flags(default_backends(plat), plat)["GGML_BLAS"] == "OFF"
    assert cmake_flags(default_backends(plat), plat, portable=True)["GGML_BLAS"] == "OFF"


def test_the_wrapper_written_is_the_hosts(tmp_path):
    import platform
    from ggml_build import cmake
    host = Platform(platform.system(), nvcc=False, nvidia_gpu=False)
    cmake.write_wrapper(tmp_path)
    assert (tmp_path / "wrapper" / "CMakeLists.txt").read_text() == cmake.wrapper_text(host)
    cmake.write_wrapper(tmp_path, MAC)
    assert "@loader_path/.." in (tmp_path / "wrapper" / "CMakeLists.txt").read_text()


def test_default_build_folder_names_follow_the_platform():
    """The folder a default build lands in, per platform (what tests/builds/test_releases.py expects)."""
    assert config_name("0.20.2", default_backends(LINUX)) == "ggml-0.20.2-cpu-rpc"
    assert config_name("0.20.2", default_backends(MAC)) == "ggml-0.20.2-cpu-rpc-metal"
