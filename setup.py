"""Packaging hook: every pip build (editable, regular, wheel) first builds ggml with
build_ggml.py, as a `build` sub-command of its own. Everything else is in pyproject.toml.

Why a sub-command and not a `build_py` override: setuptools' editable install runs a custom
`build_py` "safely", turning any error into a warning, so a failed ggml build used to end in a
"successful" install without a library. A failing sub-command fails the pip command, with the
cause and the tail of the build log.

The wheel carries exactly the build made here, whatever else is under ggml_py/lib/ (other
releases built beside it, stale copies in setuptools' build/lib): `build_py` removes every other
build folder from what it copied. It is tagged for this platform, finds its libraries through
$ORIGIN (@loader_path) rpaths, and ships the build tooling (ggml_build, build_ggml.py and the
pins as ggml_build/releases.toml), so an installed package can build other pinned releases
(`python -m ggml_build --ggml 0.25.3`). docs/wheels.md: repair (auditwheel, delocate),
cibuildwheel, the sdist. `GGML_PY_BUILD_ARGS` passes
options to build_ggml.py, e.g. `GGML_PY_BUILD_ARGS="--portable" pip wheel .` for a wheel meant
for other machines, or `--source PATH` for a local ggml tree.
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent


class BuildGGML(Command):
    description = "build the pinned ggml release and its cffi bindings (build_ggml.py)"
    user_options: list = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        args = shlex.split(os.environ.get("GGML_PY_BUILD_ARGS", ""))
        cmd = [sys.executable, str(ROOT / "build_ggml.py"), *args]
        # build_ggml.py is quick (a ninja no-op) when the build is current; its last line is the
        # output folder. Its progress goes to the terminal where there is one (pip captures
        # stdout, and shows it as it comes with -v, all of it on failure).
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "GGML_PY_PROGRESS_TTY": "1"})
        lines = []
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        if proc.wait() != 0:
            raise SystemExit(f"ggml_py: building ggml failed (build_ggml.py exit "
                             f"{proc.returncode}); the output above says why")
        out = Path("".join(lines).strip().splitlines()[-1])
        # only this build goes into the wheel (package_data is read lazily by build_py;
        # BuildPy removes whatever else include_package_data or an earlier run brought)
        self.distribution.package_data["ggml_py"] = [f"lib/{out.name}/*", "py.typed",
                                                   "compare/release_api.json"]
        self.distribution.ggml_py_build = out.name


class BuildPy(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return      # `pip install -e .`: the package is the checkout, lib/ and pins included
        target = Path(self.build_lib)
        # the pins, where an installed ggml_build finds them (ggml_build.pins.MANIFEST)
        self.mkpath(str(target / "ggml_build"))
        self.copy_file(str(ROOT / "vendor" / "releases.toml"),
                       str(target / "ggml_build" / "releases.toml"))
        keep = getattr(self.distribution, "ggml_py_build", None)
        lib = target / "ggml_py" / "lib"
        if keep is None or not lib.is_dir() or lib.resolve() == (ROOT / "ggml_py" / "lib").resolve():
            return      # no ggml build in this run (or an in-place build): nothing to narrow
        for entry in lib.iterdir():
            if entry.name != keep:
                print(f"ggml_py: not packing {entry.name} (this wheel carries {keep})")
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        if not (lib / keep / "build.json").exists():
            raise SystemExit(f"ggml_py: the wheel's build {keep} was not copied (no build.json)")


class Build(build):
    # ggml first: build_py then copies what it made
    sub_commands = [("build_ggml", None)] + build.sub_commands


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel holds shared libraries: tag it for this platform
        return True


setup(cmdclass={"build": Build, "build_ggml": BuildGGML, "build_py": BuildPy},
      distclass=BinaryDistribution)
