"""The batch accuracy job's chart: a lateness histogram and lateness per due minute.

Pure matplotlib (no Spark, no pyplot state): spark/accuracy.py aggregates in Spark and hands
the few numbers to :func:`render_chart` as a :class:`ChartData`; tests build one by hand.

How the chart is drawn, and why:

* **Histogram bins** are ``[k * width, (k + 1) * width)`` for integer ``k``: every bin edge is a
  multiple of ``width``, so 0 is always an edge and no bin straddles it. A bin is *early* (red)
  only when its upper edge is <= 0, i.e. it holds nothing but lateness < 0; on-time records
  (lateness 0 and up) are always in blue bins. ``width`` is the smallest 1-2-5 step (1, 2, 5,
  10, 20, 50 ms, ...) that covers ``[min, max]`` in at most :data:`MAX_BINS` bins, so edges are
  round numbers. Spark computes the bin index as ``floor(lateness / width)``. The count axis is
  logarithmic when the tallest bin is :data:`LOG_SCALE_RATIO` times the smallest or more, so that
  a single early or very late copy stays visible next to thousands of on-time ones.
* **Percentile markers** (p50, p99, p99.9, max) are vertical lines whose values are written in a
  legend placed outside the plot (right of it), one row per marker. Equal values (p99 == p99.9
  == max is common on small runs) draw coinciding lines but separate legend rows, so the labels
  never overlap each other, the bars or the axes; the figure uses constrained layout so that
  titles, tick labels and both legends are kept apart.
* **Lateness per due minute** (p50, p99, max of every delivered copy, grouped by the due minute):
  a minute with no delivered copy is a gap, not a straight line to the next minute with data.
  :func:`minute_series` inserts a NaN point one minute after each minute that is followed by a
  gap, which matplotlib draws as a break in the line; an isolated minute still shows its marker.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MINUTE_MS = 60_000
MAX_BINS = 60
EARLY_COLOR = "tab:red"
ON_TIME_COLOR = "tab:blue"
LOG_SCALE_RATIO = 50  # the histogram's count axis is logarithmic when the bins differ this much
MIN_TIME_SPAN = timedelta(minutes=4)
# (summary key, label, colour, line style) of the histogram's vertical markers
MARKERS: tuple[tuple[str, str, str, str], ...] = (
    ("p50", "p50", "tab:green", "--"),
    ("p99", "p99", "tab:orange", "--"),
    ("p999", "p99.9", "tab:purple", "-."),
    ("max", "max", "black", ":"),
)


class MinuteRow(NamedTuple):
    """Lateness (ms) of the delivered copies due in one minute (``minute_ms`` = its start, UTC)."""

    minute_ms: int
    p50: float
    p99: float
    max: float


@dataclass(frozen=True)
class ChartData:
    """What the chart shows.

    ``lateness`` is the summary's ``totals["lateness_ms"]`` (p50, p99, p999, max, min, ...);
    ``bins`` maps a bin index ``k`` to the number of delivered copies with lateness in
    ``[k * bin_width, (k + 1) * bin_width)``; ``minutes`` is sorted by ``minute_ms``.
    """

    title: str
    counts: Mapping[str, int]
    lateness: Mapping[str, Any]
    bin_width: int = 1
    bins: Mapping[int, int] = field(default_factory=dict)
    minutes: Sequence[MinuteRow] = ()


def bin_width(lo: int, hi: int, max_bins: int = MAX_BINS) -> int:
    """The smallest 1-2-5 step (ms) whose multiples cover ``[lo, hi]`` in at most ``max_bins`` bins."""
    if hi < lo:
        raise ValueError(f"bin_width: hi ({hi}) < lo ({lo})")
    if max_bins < 2:
        raise ValueError(f"bin_width: max_bins must be >= 2, got {max_bins}")
    decade = 1
    while True:
        for step in (1, 2, 5):
            width = step * decade
            if hi // width - lo // width + 1 <= max_bins:
                return width
        decade *= 10


def is_early_bin(index: int, width: int) -> bool:
    """Bin ``[index * width, (index + 1) * width)`` holds only lateness < 0."""
    return (index + 1) * width <= 0


def minute_series(minutes: Sequence[MinuteRow]) -> list[MinuteRow]:
    """``minutes`` (sorted) with a NaN row one minute after each minute followed by a gap."""
    out: list[MinuteRow] = []
    nan = math.nan
    for row in minutes:
        if out and row.minute_ms - out[-1].minute_ms > MINUTE_MS:
            out.append(MinuteRow(out[-1].minute_ms + MINUTE_MS, nan, nan, nan))
        out.append(row)
    return out


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:g} ms" if isinstance(value, float) else f"{value} ms"


def render_chart(data: ChartData) -> Figure:
    """The chart as a matplotlib Figure (Agg canvas attached; see the module docstring)."""
    import matplotlib.dates as mdates
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_hist, ax_time = fig.subplots(2, 1)
    fig.suptitle(textwrap.fill(data.title, 110), fontsize=10)
    c = data.counts
    ax_hist.set_title(
        f"lateness histogram: sent {c.get('sent', 0)}, delivered {c.get('delivered', 0)}, "
        f"lost {c.get('lost', 0)}, duplicates {c.get('duplicates', 0)}, early {c.get('early', 0)}",
        fontsize=9,
    )
    ax_hist.set_xlabel("lateness ms (delivered timestamp - delay.deliver-at)")
    ax_hist.set_ylabel("delivered records")
    ax_time.set_title("lateness per due minute (UTC); gaps = minutes without deliveries", fontsize=9)
    ax_time.set_xlabel("due minute (UTC)")
    ax_time.set_ylabel("lateness ms")
    legend_at: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0,
                                 "fontsize": 8}

    if not data.bins:
        for ax in (ax_hist, ax_time):
            ax.text(0.5, 0.5, "no deliveries", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
        return fig

    width = data.bin_width
    indexes = sorted(data.bins)
    heights = [data.bins[k] for k in indexes]
    ax_hist.bar(
        [k * width for k in indexes], heights, width=width, align="edge",
        color=[EARLY_COLOR if is_early_bin(k, width) else ON_TIME_COLOR for k in indexes],
        edgecolor="white", linewidth=0.3,
    )
    ax_hist.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))  # whole milliseconds
    ax_hist.ticklabel_format(axis="x", style="plain", useOffset=False)
    if max(heights) >= LOG_SCALE_RATIO * min(heights):
        ax_hist.set_yscale("log")  # a few early or very late copies stay visible next to the bulk
        ax_hist.set_ylabel("delivered records (log scale)")
    else:
        ax_hist.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    handles: list[Any] = [
        Patch(color=EARLY_COLOR, label="early (< 0 ms)"),
        Patch(color=ON_TIME_COLOR, label="on time / late (>= 0 ms)"),
    ]
    for key, label, color, style in MARKERS:
        value = data.lateness.get(key)
        if value is not None:
            handles.append(ax_hist.axvline(value, color=color, linestyle=style, linewidth=1.2,
                                           label=f"{label} {_ms(value)}"))
    ax_hist.legend(handles=handles, title=f"bin {width} ms", title_fontsize=8, **legend_at)

    series = minute_series(data.minutes)
    xs = [datetime.fromtimestamp(r.minute_ms / 1000, tz=UTC) for r in series]
    colors = {key: color for key, _, color, _ in MARKERS}
    ax_time.plot(xs, [r.p50 for r in series], marker="o", markersize=4, color=colors["p50"], label="p50")
    ax_time.plot(xs, [r.p99 for r in series], marker="o", markersize=4, color=colors["p99"], label="p99")
    ax_time.plot(xs, [r.max for r in series], marker=".", linestyle=":", color=colors["max"], label="max")
    ax_time.axhline(0, color=EARLY_COLOR, linewidth=1, label="0 (below = early)")
    ax_time.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax_time.ticklabel_format(axis="y", style="plain", useOffset=False)
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8, tz=UTC)  # type: ignore[no-untyped-call]
    ax_time.xaxis.set_major_locator(locator)
    ax_time.xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(locator, tz=UTC)  # type: ignore[no-untyped-call]
    )
    if xs:
        # at least MIN_TIME_SPAN wide, so the ticks stay on whole minutes for one or two minutes of data
        pad = max(timedelta(0), (MIN_TIME_SPAN - (xs[-1] - xs[0])) / 2)
        if pad:
            ax_time.set_xlim(xs[0] - pad, xs[-1] + pad)
    ax_time.legend(**legend_at)
    return fig


def write_chart(data: ChartData, path: str | Path) -> None:
    """Render :func:`render_chart` to a PNG at ``path``."""
    render_chart(data).savefig(path, dpi=100)
