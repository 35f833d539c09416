"""The one C extension, the direct reader's piece copies (the GIL released for a whole batch); all
else is in pyproject.toml. Optional: without a C compiler and Python's headers the build goes on and
the same copies run in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cropbench.formats._copy", ["src/cropbench/formats/_copy.c"], optional=True)])
