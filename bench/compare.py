"""A bench run beside a committed baseline: the change of every figure, printed, never asserted.

CI runs a short ``--size small`` bench (``throughput`` and ``lateness``, levels, changelog on, at
least once) after the tests and prints this table, so a change that slows the hot path shows in
the log of the submission that made it (docs/benchmarks.md, "CI comparison"). The baseline is
a small JSON file committed beside the code (``bench/baseline-small.json``), written from a run
by ``delay-sidecar bench ... --update-baseline FILE``: the figures (value and unit by dotted
path, as :func:`bench.report.walk_figures` names them) and where they were measured.

:func:`compare` is pure: two JSON documents in (each a baseline file or a full bench report),
one row per figure of either out, with the change in percent of the baseline's value (None when
either value is missing, not a number, or the baseline is 0; early records where there were none
are still called worse). A figure's direction (better when higher or lower) comes from its goal
(``>=``: higher), else its unit (a rate higher, a time lower), else its name (``ratio`` higher,
``cpu`` or ``share`` lower); the table says ``better``/``worse`` past ``NOISE_PCT`` only, since a
small run on a shared machine moves by tens of percent from run to run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.report import walk_figures

SCHEMA = 1
NOISE_PCT = 10.0  # below this, a change is called noise (small runs on a loaded machine)
# a figure without a goal: better higher for a rate, lower for a time or a cost; a unitless
# ratio ("x") by its name (a share of the passthrough's rate is better higher, a CPU cost or a wait
# share lower)
LOWER_UNITS = ("ms", "µs", "us", "s", "bytes")
HIGHER_NAMES = ("ratio", "records_per_s", "rate")
LOWER_NAMES = ("cpu", "share", "wait", "early", "lost", "duplicate")


@dataclass(frozen=True)
class Row:
    figure: str
    unit: str
    baseline: float | None
    now: float | None
    change_pct: float | None
    verdict: str  # better, worse, noise, or "" when it cannot be said


def figures_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The figures of a baseline file (``figures``) or of a bench report (``scenarios``), by
    dotted path ``<scenario>.<path>``: ``{"value", "unit", "goal"}``."""
    if "figures" in doc:
        return dict(doc["figures"])
    out: dict[str, dict[str, Any]] = {}
    for name, scenario in doc.get("scenarios", {}).items():
        for path, f in walk_figures(scenario.get("results", {})):
            out[f"{name}.{path}"] = {"value": f.get("value"), "unit": f.get("unit", ""), "goal": f.get("goal")}
    return out


def baseline_of(report: dict[str, Any], commit: str | None = None) -> dict[str, Any]:
    """The baseline document of a bench report: its figures and where they came from."""
    machine = report.get("machine", {})
    return {
        "schema": SCHEMA,
        "command": report.get("command"),
        "recorded_at": report.get("finished_at") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit or machine.get("git_commit"),
        "machine": {k: machine[k] for k in ("cpu_model", "cpu_count", "git_dirty", "loadavg_1_5_15_at_start")
                    if k in machine},
        "figures": figures_of(report),
    }


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def higher_is_better(path: str, unit: str, goal: str | None) -> bool | None:
    """The figure's direction: its goal's (``== 0``: lower), else its unit's, else its name's;
    None when none says."""
    op, _, bound = (goal or "").partition(" ")
    if op in (">=", "<="):
        return op == ">="
    if op == "==" and bound.strip() in ("0", "0.0"):
        return False
    if unit.endswith("/s"):
        return True
    if unit in LOWER_UNITS:
        return False
    name = path.rsplit(".", 1)[-1]
    if any(k in name for k in LOWER_NAMES):
        return False
    if any(k in name for k in HIGHER_NAMES):
        return True
    return None


def compare(baseline: dict[str, Any], now: dict[str, Any]) -> list[Row]:
    """One row per figure of either document, in the baseline's order then the new ones'."""
    base, cur = figures_of(baseline), figures_of(now)
    rows = []
    for path in [*base, *(p for p in cur if p not in base)]:
        b, n = base.get(path, {}), cur.get(path, {})
        bv, nv = _number(b.get("value")), _number(n.get("value"))
        unit = str(n.get("unit") or b.get("unit") or "")
        change = (nv - bv) / abs(bv) * 100 if bv not in (None, 0.0) and nv is not None else None
        verdict = ""
        up = higher_is_better(path, unit, n.get("goal") or b.get("goal"))
        if change is not None:
            if abs(change) < NOISE_PCT:
                verdict = "noise"
            elif up is not None:
                verdict = "better" if (change > 0) == up else "worse"
        elif bv == 0.0 and nv is not None and nv != 0.0 and up is not None:  # from none: no percentage
            verdict = "better" if (nv > 0) == up else "worse"
        rows.append(Row(path, unit, bv, nv, None if change is None else round(change, 1), verdict))
    return rows


def _cell(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def table(rows: list[Row]) -> str:
    """The rows as a fixed-width text table: figure, unit, baseline, now, change %, verdict."""
    head = ("figure", "unit", "baseline", "now", "change %", "")
    lines = [head] + [(r.figure, r.unit, _cell(r.baseline), _cell(r.now),
                       "-" if r.change_pct is None else f"{r.change_pct:+.1f}", r.verdict) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for k, line in enumerate(lines):
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def summary(rows: list[Row]) -> str:
    worse = [r.figure for r in rows if r.verdict == "worse"]
    return (f"{len(rows)} figures; {len(worse)} worse by >= {NOISE_PCT:.0f} %"
            + (f": {', '.join(worse)}" if worse else ""))


def print_comparison(baseline_path: Path, report: dict[str, Any]) -> str:
    """The text CI prints: the table and a summary line, or why there is none."""
    try:
        baseline = orjson.loads(baseline_path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        return f"bench comparison: no baseline ({baseline_path}: {e})"
    try:
        rows = compare(baseline, report)
    except (AttributeError, TypeError, ValueError) as e:  # a baseline of another shape: said, not raised
        return f"bench comparison: unreadable baseline {baseline_path}: {e}"
    where = f"baseline {baseline_path} ({baseline.get('commit') or 'commit unknown'}, {baseline.get('recorded_at')})"
    return f"bench comparison against the {where}:\n{table(rows)}\n{summary(rows)}"


def write_baseline(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(baseline_of(report), option=orjson.OPT_INDENT_2) + b"\n")
