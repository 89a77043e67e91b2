"""Build of the optional C accelerator ``sidecar._native`` (everything else is in pyproject.toml).

The package works without it (pure-Python twins of every function); ``scripts/setup.sh`` builds
it in place, and CI fails if it is missing (tests/unit/test_native.py). Its sources are the
translation units in sidecar/native/, each compiled on its own (sidecar/native/module.c says
which core each holds). Before the build, sidecar/native/intake_layout.h, layouts.h and native_args.h are
generated from their declarations, sidecar/store/intake_layout.py, native_layouts.py and
native_args.py (each rewritten only when it changed)."""

import sys
from glob import glob
from pathlib import Path

from setuptools import Extension, setup


def write_layouts() -> None:
    # imported from the checkout: the declarations import only the standard library and each
    # other (the package __init__ files are empty), so the package's dependencies need not be there yet
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sidecar.store import intake_layout, native_args, native_layouts

    intake_layout.main(["intake_layout"])
    native_layouts.main(["native_layouts"])
    native_args.main(["native_args"])


write_layouts()
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
