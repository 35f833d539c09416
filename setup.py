"""The one C extension, the direct reader's chunk loads and piece copies (the GIL released for a
whole batch); all else is in pyproject.toml. Optional: without a C compiler and Python's headers the
build goes on and the same work runs in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cropbench.formats._native", ["src/cropbench/formats/_native.c"], optional=True)])
