"""Build of the optional C accelerator ``sidecar._native`` (everything else is in pyproject.toml).

The package works without it (pure-Python twins of every function); ``scripts/setup.sh`` builds
it in place, and CI fails if it is missing (tests/unit/test_native.py). Its sources are the
translation units in sidecar/native/, each compiled on its own (sidecar/native/module.c says
which core each holds)."""

from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sidecar._native",
            sources=sorted(glob("sidecar/native/*.c")),
            depends=sorted(glob("sidecar/native/*.h")),  # a changed header rebuilds every unit
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,  # no compiler: the pure-Python code runs instead
        )
    ]
)
