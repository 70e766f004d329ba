"""Packaging hook: every pip build (editable, regular, wheel) first builds ggml with
build_ggml.py, as a `build` sub-command of its own. Everything else is in pyproject.toml.

Why a sub-command and not a `build_py` override: setuptools' editable install runs a custom
`build_py` "safely", turning any error into a warning, so a failed ggml build used to end in a
"successful" install without a library. A failing sub-command fails the pip command, with the
cause and the tail of the build log.

The wheel carries exactly the build made here (not other folders under ggml_py/lib/), is tagged
for this platform, and finds its libraries through $ORIGIN rpaths. `GGML_PY_BUILD_ARGS` passes
options to build_ggml.py, e.g. `GGML_PY_BUILD_ARGS="--portable" pip wheel .` for a wheel meant
for other machines, or `--source PATH` for a local ggml tree.
"""
import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build
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
        # stdout, and shows it all only with -v or on failure).
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "GGML_PY_PROGRESS_TTY": "1"})
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            raise SystemExit(f"ggml_py: building ggml failed (build_ggml.py exit "
                             f"{proc.returncode}); the output above says why")
        out = Path(proc.stdout.strip().splitlines()[-1])
        # only this build goes into the wheel (package_data is read lazily by build_py)
        self.distribution.package_data["ggml_py"] = [f"lib/{out.name}/*", "py.typed"]


class Build(build):
    # ggml first: build_py then copies what it made
    sub_commands = [("build_ggml", None)] + build.sub_commands


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel holds shared libraries: tag it for this platform
        return True


setup(cmdclass={"build": Build, "build_ggml": BuildGGML}, distclass=BinaryDistribution)
