"""Development tools that live beside the package, not in it: the benchmarks (``bench/``) and
the development broker launcher (``devkafka/``).

Why they are not in ``sidecar``: the installed product (the wheel, the container image) is the
sidecar alone; a benchmark harness and a Kafka launcher that fetches jars with Maven are
development tools. Their CLI subcommands (``bench``, ``dev-kafka``, ``demo``, and ``run`` with no
bootstrap servers) load them lazily from the source checkout the package was imported from.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

CHECKOUT = Path(__file__).resolve().parent.parent


class DevToolMissing(RuntimeError):
    """A development tool was asked for outside a source checkout."""


def load(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (e.g. ``devkafka.local``) from the checkout this package runs from."""
    top = module.split(".", 1)[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != top:
            raise
    if (CHECKOUT / top / "__init__.py").is_file():
        sys.path.append(str(CHECKOUT))
        return importlib.import_module(module)
    raise DevToolMissing(
        f"{purpose} needs the source checkout's {top}/ directory, which this installation does not "
        f"have (only the sidecar itself is installed); run it from a clone of the repository"
    )
