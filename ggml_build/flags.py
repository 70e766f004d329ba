"""Which backends a build gets and the CMake flags for them: pure logic, tested as such.

The platform is passed in (``Platform``) rather than looked up inside, so tests can ask
"what would macOS get?" on Linux.
"""
from __future__ import annotations

import hashlib
import platform as _platform
import shutil
import subprocess
from dataclasses import dataclass

from .errors import BuildError

KNOWN = ("cpu", "rpc", "metal", "cuda", "vulkan")
ALWAYS = ("cpu", "rpc")


@dataclass(frozen=True)
class Platform:
    system: str          # platform.system(): "Linux", "Darwin", "Windows"
    nvcc: bool           # nvcc on PATH
    nvidia_gpu: bool     # an NVIDIA GPU is visible to this process

    @classmethod
    def detect(cls) -> "Platform":
        return cls(_platform.system(), shutil.which("nvcc") is not None, _nvidia_gpu_visible())


def _nvidia_gpu_visible() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and any(line.startswith("GPU ") for line in out.stdout.splitlines())


def default_backends(plat: Platform) -> tuple[str, ...]:
    """CPU and RPC always; Metal on macOS; CUDA only with nvcc *and* a visible GPU.

    Vulkan is never a default: it needs extra packages and is asked for by name.
    """
    chosen = list(ALWAYS)
    if plat.system == "Darwin":
        chosen.append("metal")
    if plat.nvcc and plat.nvidia_gpu:
        chosen.append("cuda")
    return tuple(chosen)


def parse_backends(text: str | None, plat: Platform) -> tuple[str, ...]:
    """`--backends cpu,rpc,cuda` -> ordered tuple; None -> the platform default."""
    if not text:
        return default_backends(plat)
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise BuildError(f"unknown backend(s): {', '.join(unknown)}",
                         f"choose from {', '.join(KNOWN)}")
    if "metal" in names and plat.system != "Darwin":
        raise BuildError("the Metal backend builds on macOS only", "drop metal from --backends")
    # CPU and RPC are always built: the package relies on both.
    return tuple(n for n in KNOWN if n in ALWAYS or n in names)


def rpath_origin(plat: Platform) -> str:
    """The loader's token for "the folder of this binary" in an rpath: ``@loader_path`` for
    macOS' dyld, ``$ORIGIN`` for ELF loaders (dyld ignores ``$ORIGIN``)."""
    return "@loader_path" if plat.system == "Darwin" else "$ORIGIN"


def library_suffix(plat: Platform) -> str:
    """What the shared libraries of a build end with on `plat` (CMake's SHARED libraries)."""
    return {"Darwin": ".dylib", "Windows": ".dll"}.get(plat.system, ".so")


def cmake_flags(backends: tuple[str, ...], plat: Platform, *, native: bool = False,
                cuda_arch: str | None = None, portable: bool = False) -> dict[str, str]:
    """The -D options for a configuration (besides paths).

    The CPU backend is built as llama.cpp's own releases build it: llamafile's sgemm kernels
    on (ggml's standalone default is off; on, a 1024^3 f32 matmul runs about numpy's speed
    instead of 2.4x slower), no -march=native unless asked. `portable` is the layout of
    llama.cpp's release binaries: backends as modules loaded at run time (GGML_BACKEND_DL) and
    one CPU module per instruction-set level (GGML_CPU_ALL_VARIANTS), the best one chosen on
    the machine that runs it; without it, GGML_NATIVE=OFF on x86-64 still compiles AVX2/FMA
    code that dies with SIGILL on older processors."""
    origin = rpath_origin(plat)
    flags = {
        "CMAKE_BUILD_TYPE": "Release",
        "BUILD_SHARED_LIBS": "ON",
        "GGML_NATIVE": "ON" if native else "OFF",
        "GGML_BUILD_TESTS": "OFF",
        "GGML_BUILD_EXAMPLES": "OFF",
        "GGML_RPC": "ON",
        "GGML_BACKEND_DL": "ON" if portable else "OFF",
        "GGML_LLAMAFILE": "ON",
        # one file per library (libggml.so, no .so.0 symlinks): wheels do not keep symlinks
        "CMAKE_PLATFORM_NO_VERSIONED_SONAME": "ON",
        "CMAKE_INSTALL_RPATH": origin,
        "CMAKE_BUILD_WITH_INSTALL_RPATH": "ON",
        "GGML_METAL": "OFF",
        "GGML_CUDA": "OFF",
        "GGML_VULKAN": "OFF",
        # ggml turns on an Apple Accelerate "BLAS" device by default on macOS. Off: it is a
        # third local device (type accel) that does only mul_mat/out_prod on host memory, with
        # no events, no async and no buffer type of its own; every device-parametrized test
        # and every scheduler would meet it, and the matmuls it takes over run on Metal or in
        # the CPU backend's llamafile kernels anyway. Stated on every platform, so a build's
        # device list does not depend on a platform default.
        "GGML_BLAS": "OFF",
    }
    if portable:
        if native:
            raise BuildError("--portable and --native contradict each other",
                             "--native tunes for this processor; --portable runs on any")
        flags["GGML_CPU_ALL_VARIANTS"] = "ON"
    if "metal" in backends:
        flags.update(GGML_METAL="ON", GGML_METAL_EMBED_LIBRARY="ON")
    if "cuda" in backends:
        flags.update(GGML_CUDA="ON", CMAKE_CUDA_ARCHITECTURES=cuda_arch or "native")
    if "vulkan" in backends:
        flags["GGML_VULKAN"] = "ON"
    return flags


def config_name(release: str, backends: tuple[str, ...], *, native: bool = False,
                cuda_arch: str | None = None, source: str | None = None,
                portable: bool = False) -> str:
    """One output folder per release and configuration, e.g. ``ggml-0.25.3-cpu-rpc``."""
    parts = [f"ggml-{release}"]
    if source is not None:  # a local tree: keep different checkouts apart
        parts.append("src" + hashlib.sha256(source.encode()).hexdigest()[:8])
    for b in backends:
        parts.append(f"cuda{cuda_arch}" if b == "cuda" and cuda_arch else b)
    if native:
        parts.append("native")
    if portable:
        parts.append("portable")
    return "-".join(parts)
