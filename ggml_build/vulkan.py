"""What a Vulkan build of ggml needs, checked before CMake runs, and newer headers when the
system's are too old.

ggml's Vulkan backend needs the Vulkan headers >= 1.3.272, ``glslc`` (shader compiler), the
SPIR-V headers and a Vulkan loader; to run without a GPU, Mesa's software driver (lavapipe).
Debian bookworm ships headers 1.3.239, so newer ones are taken as *files only* from the next
Debian release's ``libvulkan-dev`` package, fetched with apt through the machine's own apt
configuration (its mirrors, with the suite renamed), unpacked under ``vendor/vulkan-headers``
and handed to CMake; the system's loader and packages stay untouched.

    python -m ggml_build.vulkan --install    # apt-get the packages, then fetch the headers
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import BuildError

MIN_HEADER = 272                       # VK_HEADER_VERSION that ggml 0.25.3 needs (1.3.272)
PACKAGES = ["libvulkan-dev", "glslc", "spirv-headers", "mesa-vulkan-drivers"]
ROOT = Path(__file__).resolve().parent.parent
HEADERS = ROOT / "vendor" / "vulkan-headers"
NEWER_SUITE = {"bookworm": "trixie"}   # where newer headers come from, by the system's suite


def header_version(include: Path) -> int | None:
    core = include / "vulkan" / "vulkan_core.h"
    if not core.exists():
        return None
    m = re.search(r"#define\s+VK_HEADER_VERSION\s+(\d+)", core.read_text(errors="replace"))
    return int(m.group(1)) if m else None


def version_text(include: Path) -> str:
    core = include / "vulkan" / "vulkan_core.h"
    m = re.search(r"VK_HEADER_VERSION_COMPLETE\s+VK_MAKE_API_VERSION\(\s*0,\s*(\d+),\s*(\d+)",
                  core.read_text(errors="replace")) if core.exists() else None
    return f"{m.group(1)}.{m.group(2)}.{header_version(include)}" if m else "none"


def _loader_present() -> bool:
    pats = ["/usr/lib/*/libvulkan.so", "/usr/lib/libvulkan.so", "/usr/lib64/libvulkan.so"]
    return any(glob.glob(p) for p in pats)


def missing_packages(*, driver: bool = True) -> list[str]:
    """Debian packages of PACKAGES whose files are not on this machine. `driver=False` leaves
    out Mesa's software driver: a build needs none (a machine with a GPU brings its vendor's
    driver, e.g. NVIDIA's ICD), only running without a GPU does."""
    missing = []
    if not _loader_present():
        missing.append("libvulkan-dev")
    if shutil.which("glslc") is None:
        missing.append("glslc")
    if not Path("/usr/include/spirv/unified1/spirv.hpp").exists():
        missing.append("spirv-headers")
    if driver and not glob.glob("/usr/share/vulkan/icd.d/lvp_icd*.json"):
        missing.append("mesa-vulkan-drivers")
    return missing


def _glslc_runs() -> None:
    """ggml's CMake probes glslc's shader extensions by matching "extension not supported" in
    its errors; a glslc that cannot run at all (a missing libshaderc) matches nothing, so every
    extension is taken as supported and the build later fails compiling shaders it cannot
    compile. The probe's answer is also kept in the shader generator's own CMake cache, so a
    build folder configured with a broken glslc stays wrong after glslc is fixed."""
    try:
        r = subprocess.run(["glslc", "--version"], capture_output=True, text=True, timeout=60)
        ok, why = r.returncode == 0, (r.stderr or r.stdout).strip()[-300:]
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, str(e)
    if not ok:
        raise BuildError(f"glslc is installed but does not run: {why}",
                         "reinstall glslc and libshaderc1 (apt-get install --reinstall glslc "
                         "libshaderc1), then delete the Vulkan build folder under build/")


def include_dir() -> Path:
    """A Vulkan include folder new enough for ggml: the system's, else vendor/vulkan-headers.
    Raises BuildError saying what to run when neither is."""
    missing = missing_packages(driver=False)
    if missing:
        raise BuildError(f"the Vulkan build needs {', '.join(missing)}",
                         f"apt-get install {' '.join(PACKAGES)} (or: python -m ggml_build.vulkan "
                         "--install)")
    _glslc_runs()
    system = Path("/usr/include")
    if (header_version(system) or 0) >= MIN_HEADER:
        return system
    ours = HEADERS / "usr" / "include"
    if (header_version(ours) or 0) >= MIN_HEADER:
        return ours
    raise BuildError(f"the system's Vulkan headers are {version_text(system)}; ggml needs "
                     f">= 1.3.{MIN_HEADER}",
                     "python -m ggml_build.vulkan --install (fetches newer headers as files "
                     "into vendor/vulkan-headers)")


def _apt_sources(suite_map: dict[str, str]) -> str:
    """The machine's Debian sources (one-line format), suites renamed by `suite_map`."""
    lines = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":               # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                f = dict(re.findall(r"^(\w[\w-]*):\s*(.+)$", stanza, re.M))
                if "deb" not in f.get("Types", "").split():
                    continue
                key = f.get("Signed-By", "").strip()
                for uri in f.get("URIs", "").split():
                    for suite in f.get("Suites", "").split():
                        lines.append((uri, suite, f.get("Components", "main"),
                                      f"[signed-by={key}] " if key.startswith("/") else ""))
        elif path.suffix == ".list":
            for line in text.splitlines():
                parts = line.split("#")[0].split()
                if parts[:1] == ["deb"]:
                    opts = " ".join(p for p in parts[1:] if p.startswith("[") or p.endswith("]"))
                    parts = [p for p in parts[1:] if not (p.startswith("[") or p.endswith("]"))]
                    if len(parts) >= 3:
                        lines.append((parts[0], parts[1], " ".join(parts[2:]),
                                      opts + " " if opts else ""))
    out = []
    for uri, suite, comps, opts in lines:
        base = suite.split("-")[0]
        if base in suite_map and suite == base:     # the main suite only, not -updates/-security
            # signatures are checked as for the machine's own sources (same keyring)
            out.append(f"deb {opts}{uri} {suite_map[base]} {comps}")
    return "\n".join(dict.fromkeys(out)) + "\n"


def fetch_headers() -> Path:
    """Download the newer suite's libvulkan-dev with apt (download only, nothing installed)
    and unpack its headers under vendor/vulkan-headers."""
    sources = _apt_sources(NEWER_SUITE)
    if not sources.strip():
        raise BuildError("no Debian source for newer Vulkan headers in this machine's apt "
                         "configuration",
                         f"install Vulkan headers >= 1.3.{MIN_HEADER} and build again")
    with tempfile.TemporaryDirectory(prefix="ggml_py-vk-") as tmp:
        t = Path(tmp)
        (t / "lists" / "partial").mkdir(parents=True)
        (t / "cache" / "archives" / "partial").mkdir(parents=True)
        (t / "sources.list").write_text(sources)
        opts = [f"-oDir::Etc::SourceList={t / 'sources.list'}", "-oDir::Etc::SourceParts=-",
                f"-oDir::State::Lists={t / 'lists'}", f"-oDir::Cache={t / 'cache'}",
                "-oAPT::Architecture=amd64", "-oDebug::NoLocking=1", "-oAcquire::Languages=none"]
        for cmd in (["apt-get", *opts, "update"], ["apt-get", *opts, "download", "libvulkan-dev"]):
            r = subprocess.run(cmd, cwd=t, capture_output=True, text=True)
            if r.returncode != 0:
                last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
                raise BuildError(f"apt could not fetch libvulkan-dev ({last[0]})",
                                 f"install Vulkan headers >= 1.3.{MIN_HEADER} by hand")
        deb = next(t.glob("libvulkan-dev_*.deb"))
        staging = Path(tempfile.mkdtemp(dir=HEADERS.parent if HEADERS.parent.exists() else None))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True)
        (staging / "SOURCE").write_text(deb.name + "\n")
        if HEADERS.exists():
            shutil.rmtree(HEADERS)
        os.replace(staging, HEADERS)
    return HEADERS / "usr" / "include"


def install() -> Path:
    """apt-get install the packages (as root), then make sure the headers are new enough."""
    missing = missing_packages()
    if missing:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True)
        subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", *PACKAGES], check=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    try:
        return include_dir()
    except BuildError:
        return fetch_headers()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ggml_build.vulkan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--install", action="store_true",
                    help="apt-get install the packages and fetch newer headers if needed")
    args = ap.parse_args(argv)
    try:
        inc = install() if args.install else include_dir()
    except BuildError as e:
        print(f"vulkan: error: {e}", file=sys.stderr)
        return 1
    print(f"Vulkan headers {version_text(inc)} in {inc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
