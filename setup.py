"""Build of the optional C accelerator ``sidecar._native`` (everything else is in pyproject.toml).

The package works without it (pure-Python twins of every function); ``scripts/setup.sh`` builds
it in place, and CI fails if it is missing (tests/unit/test_native.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sidecar._native",
            sources=["sidecar/_native.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,  # no compiler: the pure-Python code runs instead
        )
    ]
)
