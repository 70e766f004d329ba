"""Build machinery behind build_ggml.py: pins, backend flags, CMake, cffi bindings.

Kept apart from the ggml_py package because it runs before any library exists.
"""
from .errors import BuildError

__all__ = ["BuildError"]
