"""Build of the optional C accelerator ``sidecar._native`` (everything else is in pyproject.toml).

The package works without it (pure-Python twins of every function); ``scripts/setup.sh`` builds
it in place, and CI fails if it is missing (tests/unit/test_native.py). Its sources are the
translation units in sidecar/native/, each compiled on its own (sidecar/native/module.c says
which core each holds). Before the build, sidecar/native/intake_layout.h is generated from its
declaration, sidecar/store/intake_layout.py (rewritten only when it changed)."""

import importlib.util
from glob import glob
from pathlib import Path

from setuptools import Extension, setup


def write_intake_layout() -> None:
    # loaded from its file: the package's imports need its dependencies, which may not be there yet
    path = Path(__file__).resolve().parent / "sidecar" / "store" / "intake_layout.py"
    spec = importlib.util.spec_from_file_location("_kds_intake_layout", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["intake_layout"])


write_intake_layout()
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
