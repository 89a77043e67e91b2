"""Report building blocks: figures with goals, machine facts, and the Markdown table.

A *figure* is the unit of the JSON report: ``{"value": ..., "unit": ..., "goal": ..., "met": ...}``.
``goal`` is a human-readable bound (``">= 0.7"``) or ``None`` for a figure that is reported for
context only; ``met`` is ``True``/``False`` against that bound, ``None`` without a goal or when
the value could not be measured (``value`` is then ``None`` and a ``note`` says why).
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

Figure = dict[str, Any]


def fig(value: float | int | None, unit: str, goal: str | None = None, note: str | None = None) -> Figure:
    """A figure; ``goal`` is ``"<= X"`` or ``">= X"`` (or ``"== X"``) and ``met`` is computed."""
    out: Figure = {"value": _round(value), "unit": unit, "goal": goal, "met": _met(value, goal)}
    if note:
        out["note"] = note
    return out


def spread(values: Sequence[float | None]) -> float | None:
    """``(max - min) / median`` of the known (non-zero) values: how much a rate (or a latency)
    moved over the rounds of one run, relative to its level; ``None`` with none known."""
    known = [v for v in values if v]
    med = statistics.median(known) if known else None
    return (max(known) - min(known)) / med if known and med else None


def _round(value: float | int | None) -> float | int | None:
    if isinstance(value, float):
        return round(value, 4) if abs(value) < 100 else round(value, 1)
    return value


def _met(value: float | int | None, goal: str | None) -> bool | None:
    if goal is None or value is None:
        return None
    op, _, bound = goal.partition(" ")
    b = float(bound)
    if op == "<=":
        return bool(value <= b)
    if op == ">=":
        return bool(value >= b)
    if op == "==":
        return bool(value == b)
    raise ValueError(f"bad goal {goal!r}")


def is_figure(node: Any) -> bool:
    return isinstance(node, dict) and {"value", "unit", "goal", "met"} <= node.keys()


def walk_figures(node: Any, path: str = "") -> Iterator[tuple[str, Figure]]:
    """Every figure below ``node`` with its dotted path."""
    if is_figure(node):
        yield path, node
        return
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk_figures(v, f"{path}.{k}" if path else str(k))


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _redis_version() -> str | None:
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return out.strip() or None


def machine_facts(kafka_version: str | None) -> dict[str, Any]:
    import confluent_kafka

    repo = Path(__file__).resolve().parents[1]
    status = _git(repo, "status", "--porcelain", "--untracked-files=no")
    vm = psutil.virtual_memory()
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_bytes": vm.total,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "confluent_kafka": str(getattr(confluent_kafka, "__version__", "") or confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka": kafka_version,
        "redis": _redis_version(),
        "git_commit": _git(repo, "rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown_table(report: dict[str, Any]) -> str:
    """One row per figure: scenario, figure path, value, unit, goal, met."""
    rows = ["| scenario | figure | value | unit | goal | met |", "| --- | --- | ---: | --- | --- | --- |"]
    for name, scenario in report.get("scenarios", {}).items():
        for path, f in walk_figures(scenario.get("results", {})):
            met = {True: "yes", False: "**no**", None: ""}[f["met"]]
            rows.append(f"| {name} | {path} | {_fmt(f['value'])} | {f['unit']} | {f['goal'] or ''} | {met} |")
        if scenario.get("error"):
            rows.append(f"| {name} | error | {scenario['error'][:80]} | | | **no** |")
    return "\n".join(rows)


def markdown_pivot(report: dict[str, Any]) -> str:
    """The figures with one column per scheduler (and one for baselines: passthrough, Redis), one
    row per scenario and figure path with the scheduler taken out: the compact table of the docs."""
    scheds = list(report.get("settings", {}).get("schedulers", ["levels", "wheel"]))
    rows: dict[tuple[str, str], dict[str, Figure]] = {}
    for name, scenario in report.get("scenarios", {}).items():
        for path, f in walk_figures(scenario.get("results", {})):
            parts = path.split(".")
            col = "baseline"
            for s in scheds:
                if s in parts:
                    parts.remove(s)
                    col = s
                    break
            rows.setdefault((name, ".".join(parts)), {})[col] = f
    head = ["scenario", "figure", *scheds, "baseline", "unit", "goal", "met"]
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---", "---"] + ["---:"] * (len(scheds) + 1)
                                                          + ["---", "---", "---"]) + " |"]
    for (name, path), cols in rows.items():
        any_f = next(iter(cols.values()))
        mets = [cols[c]["met"] for c in [*scheds, "baseline"] if c in cols and cols[c]["met"] is not None]
        met = "" if not mets else ("yes" if all(mets) else ("**no**" if not any(mets) else "partly"))
        vals = [_fmt(cols[c]["value"]) if c in cols else "" for c in [*scheds, "baseline"]]
        out.append(f"| {name} | {path} | " + " | ".join(vals) + f" | {any_f['unit']} | {any_f['goal'] or ''} | {met} |")
    return "\n".join(out)
