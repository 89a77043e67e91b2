"""The packages of ``sidecar/`` form layers that point one way, and no two modules import each other.

Layers, bottom first (``LAYERS``): what every part needs (the wire contract, settings, logging,
``runtime``: thread policy and heap release), the retry policy, the store (with header parsing,
the recurring schedules' policy it fires, and the scheduler interface it implements), the
schedulers over the store (``wheel``, ``levels``), the engine, and everything above (the CLI,
``inspect``, the client, DLQ tools, health), which is every module not listed. A module may
import its own layer or a lower one only: the store never imports the engine. A new package goes
into the layer of the lowest module that imports it.

Imports are read from the AST, function-level ones included (a lazy import hides a cycle from
the interpreter, not from a reader); imports under ``if TYPE_CHECKING:`` are annotations only and
do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAYERS: list[tuple[str, ...]] = [
    ("sidecar._native", "sidecar.contract", "sidecar.durations", "sidecar.config", "sidecar.logs",
     "sidecar.kafka_logs", "sidecar.kafka_errors", "sidecar.tls_check", "sidecar.status", "sidecar.runtime",
     "sidecar.tenants"),
    ("sidecar.retry",),
    ("sidecar.store", "sidecar.headers", "sidecar.scheduling", "sidecar.recurring"),
    ("sidecar.wheel", "sidecar.levels"),
    ("sidecar.engine",),
]
TOP = len(LAYERS)  # every module not listed


def _module_names() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "sidecar").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _module_names()


def layer(module: str) -> int:
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    return TOP


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _resolve(name: str) -> str | None:
    """The sidecar module an import names (``from a.b import c`` may name module ``a.b.c``)."""
    while name and name not in MODULES and name != "sidecar._native":
        name = name.rpartition(".")[0]
    return name if name.startswith("sidecar.") else None


def imports(module: str) -> list[tuple[str, int]]:
    """(imported sidecar module, line) for every runtime import in ``module``."""
    path = MODULES[module]
    return imports_in(path.read_text(), module, path.name == "__init__.py")


def imports_in(source: str, module: str, is_package: bool = False) -> list[tuple[str, int]]:
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.extend((f"{base}.{a.name}", node.lineno) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    out = []
    for name, line in found:
        target = _resolve(name)
        if target is not None and target != module:
            out.append((target, line))
    return out


GRAPH = {m: imports(m) for m in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    up = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {target} (layer {layer(target)} > {layer(module)})"
          for target, line in GRAPH[module] if layer(target) > layer(module)]
    assert not up, "\n".join(up)


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over the module graph: each must be one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in GRAPH.get(v, []):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in sorted(MODULES):
        if m not in index:
            connect(m)
    assert not cycles, cycles


def test_the_checks_see_the_imports() -> None:
    """A lazy import counts like one at the top, a relative one is resolved, one under
    ``TYPE_CHECKING`` does not count; and the graph is the real one."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from sidecar import logs\n"
        "from . import codec\n"
        "if TYPE_CHECKING:\n"
        "    from sidecar.engine.loop import Sidecar\n"
        "def f():\n"
        "    from sidecar.engine.clock import SystemClock\n"
    )
    got = imports_in(source, "sidecar.store.example")
    assert got == [("sidecar.logs", 2), ("sidecar.store.codec", 3), ("sidecar.engine.clock", 7)]
    assert [t for t, _ in got if layer(t) > layer("sidecar.store.example")] == ["sidecar.engine.clock"]
    assert any(t == "sidecar.runtime.threads" for t, _ in GRAPH["sidecar.store.mapped"])
    assert any(t.startswith("sidecar.store.") for t, _ in GRAPH["sidecar.engine.loop"])
    assert any(t == "sidecar.logs" for t, _ in GRAPH["sidecar.cli"])  # imported inside cmd_run
    assert layer("sidecar.store.partition") < layer("sidecar.engine.loop") < layer("sidecar.cli")
