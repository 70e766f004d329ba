"""Packaging hook: `pip install -e .` (or a wheel build) first builds the default ggml release
with build_ggml.py when it is not built yet. Everything else is declared in pyproject.toml."""
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildGGML(build_py):
    def run(self):
        # build_ggml.py is a no-op (well under 2 s) when the build is current.
        subprocess.check_call([sys.executable, str(ROOT / "build_ggml.py")], cwd=ROOT)
        super().run()


setup(cmdclass={"build_py": BuildGGML})
