"""The accuracy chart (spark/chart.py): bins with an edge at 0, labels that never overlap, gaps.

Most tests render a :class:`ChartData` built by hand (matplotlib only) and inspect the Figure:
the bars' rectangles, the texts' bounding boxes as the Agg renderer lays them out, and the data
of the per-minute lines. One test runs the Spark half (``chart_data``) on a real SparkSession.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from spark.chart import (
    EARLY_COLOR,
    MAX_BINS,
    MINUTE_MS,
    ON_TIME_COLOR,
    ChartData,
    MinuteRow,
    bin_width,
    is_early_bin,
    minute_series,
    render_chart,
    write_chart,
)

pytestmark = [pytest.mark.spark]

BASE = 1_735_725_600_000  # 2025-01-01T10:00:00Z
COUNTS = {"sent": 9, "delivered": 7, "lost": 1, "duplicates": 1, "early": 1}


def data_for(values: list[int], minutes: list[MinuteRow] | None = None, title: str = "in -> out",
             **overrides: Any) -> ChartData:
    """ChartData as chart_data() builds it, from raw lateness values (nearest-rank percentiles)."""
    ordered = sorted(values)

    def rank(q: float) -> int:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    lateness: dict[str, Any] = {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "p999": rank(0.999),
                                "max": ordered[-1], "min": ordered[0]}
    lateness.update(overrides)
    width = bin_width(ordered[0], ordered[-1])
    bins: dict[int, int] = {}
    for v in values:
        bins[v // width] = bins.get(v // width, 0) + 1
    if minutes is None:
        minutes = [MinuteRow(BASE, float(rank(0.5)), float(rank(0.99)), float(ordered[-1]))]
    return ChartData(title=title, counts=COUNTS, lateness=lateness, bin_width=width, bins=bins, minutes=minutes)


def drawn_texts(fig: Figure, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Bbox]]:
    """Every non-empty text the renderer actually draws, with its bounding box in pixels."""
    drawn: dict[int, Text] = {}
    original = Text.draw

    def spy(self: Text, renderer: Any) -> None:
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn[id(self)] = self

    with monkeypatch.context() as m:
        m.setattr(Text, "draw", spy)
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    return [(t.get_text(), t.get_window_extent(renderer)) for t in drawn.values()]


def overlapping(texts: list[tuple[str, Bbox]]) -> list[tuple[str, str]]:
    pairs = []
    for (a, box_a), (b, box_b) in itertools.combinations(texts, 2):
        inter = Bbox.intersection(box_a, box_b)
        if inter is not None and inter.width > 0 and inter.height > 0:
            pairs.append((a, b))
    return pairs


def hist_bars(fig: Figure) -> list[Rectangle]:
    return [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]


def minutes_at(*offsets: int) -> list[MinuteRow]:
    return [MinuteRow(BASE + m * MINUTE_MS, 10.0 + m, 50.0 + m, 80.0 + m) for m in offsets]


ADVERSARIAL = {
    # the test scenario's figures: p99, p99.9 and max are all the same copy
    "p99=p99.9=max": data_for([-7, 5, 10, 20, 50, 100, 300, 1000], minutes_at(0, 1, 5)),
    # every marker (and the whole histogram) at one value
    "all-equal-zero": data_for([0, 0, 0]),
    "all-equal-late": data_for([250] * 40),
    "only-early": data_for([-3, -2, -1, -1]),
    # huge values (offset/scientific tick labels), a wrapped title, a very skewed histogram
    "huge": data_for([-98_765_432, *[123_456_789] * 10_000], minutes_at(0, 59, 120),
                     title="delay.ingress.with.a.long.name -> (orders|payments|refunds)\\.(eu|us)\\..*-v[0-9]+" * 3),
    "three-hours-with-gaps": data_for(list(range(-5, 400)), minutes_at(*[m for m in range(180) if m % 7])),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_no_two_labels_overlap(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = ADVERSARIAL[name]
    fig = render_chart(data)
    texts = drawn_texts(fig, monkeypatch)
    labels = {t for t, _ in texts}
    for key, label in (("p50", "p50"), ("p99", "p99"), ("p999", "p99.9"), ("max", "max")):
        assert f"{label} {data.lateness[key]} ms" in labels, (label, sorted(labels))
    assert overlapping(texts) == []
    page = fig.bbox
    assert [t for t, box in texts if not (page.contains(box.x0, box.y0) and page.contains(box.x1, box.y1))] == []


@pytest.mark.parametrize("lo,hi", [(-7, 1000), (0, 0), (-1, -1), (-5, 5), (3, 4), (-98_765_432, 123_456_789),
                                   (0, 59), (0, 60), (-1, 0)])
def test_bin_width_covers_the_range_in_few_round_bins(lo: int, hi: int) -> None:
    width = bin_width(lo, hi)
    steps = [step * 10**e for e in range(10) for step in (1, 2, 5)]
    assert width in steps
    assert hi // width - lo // width + 1 <= MAX_BINS
    smaller = [w for w in steps if w < width]
    if smaller:  # and it is the smallest round width that fits
        assert hi // smaller[-1] - lo // smaller[-1] + 1 > MAX_BINS
    with pytest.raises(ValueError, match="hi"):
        bin_width(hi + 1, hi)


def test_histogram_has_an_edge_at_zero_and_early_bins_only_below_it() -> None:
    # -7 early; 0 and 5 on time. A bin starting at min (-7) would hold -7, 0 and 5 and be red.
    data = data_for([-7, 0, 5, 10, 20, 50, 100, 300, 1000])
    fig = render_chart(data)
    bars = hist_bars(fig)
    assert len(bars) == len(data.bins)
    width = data.bin_width
    for bar in bars:
        left, right = bar.get_x(), bar.get_x() + bar.get_width()
        assert bar.get_width() == width
        assert left % width == 0, left  # every edge is a multiple of the width: 0 is an edge
        assert not left < 0 < right
        expected = EARLY_COLOR if right <= 0 else ON_TIME_COLOR
        assert bar.get_facecolor() == to_rgba(expected), (left, right)
    reds = [b for b in bars if b.get_facecolor() == to_rgba(EARLY_COLOR)]
    assert [(b.get_x(), b.get_height()) for b in reds] == [(-width, 1)]
    zero_bar = next(b for b in bars if b.get_x() == 0)
    assert zero_bar.get_height() == 3  # 0, 5 and 10: on time, blue


def test_is_early_bin() -> None:
    assert is_early_bin(-1, 20) and is_early_bin(-3, 1)
    assert not is_early_bin(0, 20) and not is_early_bin(0, 1) and not is_early_bin(4, 5)


def _line_points(fig: Figure) -> dict[str, list[tuple[datetime, float]]]:
    ax_time = fig.axes[1]
    return {
        str(line.get_label()): list(zip(line.get_xdata(), line.get_ydata(), strict=True))  # type: ignore[arg-type]
        for line in ax_time.get_lines()
        if line.get_label() in ("p50", "p99", "max")
    }


def test_minutes_without_data_break_the_line() -> None:
    data = data_for([1, 2, 3], minutes_at(0, 1, 3, 7, 8))
    lines = _line_points(render_chart(data))
    assert set(lines) == {"p50", "p99", "max"}

    def at(offset: int) -> datetime:
        return datetime.fromtimestamp((BASE + offset * MINUTE_MS) / 1000, tz=UTC)

    for name, points in lines.items():
        xs = [x for x, _ in points]
        ys = [y for _, y in points]
        assert xs == [at(0), at(1), at(2), at(3), at(4), at(7), at(8)], name
        gaps = [i for i, y in enumerate(ys) if math.isnan(y)]
        assert gaps == [2, 4], (name, ys)  # a NaN right after 10:01 and after 10:03, none elsewhere
    assert [y for _, y in lines["p50"] if not math.isnan(y)] == [10.0, 11.0, 13.0, 17.0, 18.0]


def test_minute_series_leaves_consecutive_minutes_alone() -> None:
    rows = minutes_at(0, 1, 2)
    assert minute_series(rows) == rows
    assert minute_series([]) == []
    [first, gap, last] = minute_series(minutes_at(0, 2))
    assert (first.minute_ms, gap.minute_ms, last.minute_ms) == (BASE, BASE + MINUTE_MS, BASE + 2 * MINUTE_MS)
    assert all(math.isnan(v) for v in gap[1:])


def test_no_deliveries_and_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = ChartData(title="in -> out", counts={**COUNTS, "delivered": 0},
                      lateness={"p50": None, "p99": None, "p999": None, "max": None, "min": None})
    fig = render_chart(empty)
    texts = drawn_texts(fig, monkeypatch)
    assert [t for t, _ in texts].count("no deliveries") == 2
    assert overlapping(texts) == []
    path = tmp_path / "chart.png"
    write_chart(ADVERSARIAL["p99=p99.9=max"], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def lateness_frame(spark: Any) -> Iterator[Any]:
    rows = [(v, BASE) for v in (-7, 5, 10, 20, 50, 100, 300)] + [(1000, BASE + MINUTE_MS), (None, BASE)]
    yield spark.createDataFrame(rows, "lateness_ms bigint, minute_ms bigint")


@pytest.mark.integration
def test_chart_data_bins_on_zero_in_spark(lateness_frame: Any) -> None:
    from spark.accuracy import chart_data

    lat = {"p50": 20, "p90": 300, "p99": 1000, "p999": 1000, "max": 1000, "min": -7, "mean": 184.75}
    totals = {**COUNTS, "lateness_ms": lat}
    data = chart_data(lateness_frame, totals, title="t")
    assert data.bin_width == 20
    # -7 alone in [-20, 0); 5 and 10 in [0, 20); nothing straddles 0
    assert data.bins == {-1: 1, 0: 2, 1: 1, 2: 1, 5: 1, 15: 1, 50: 1}
    assert list(data.minutes) == [MinuteRow(BASE, 20.0, 300.0, 300.0), MinuteRow(BASE + MINUTE_MS, 1000, 1000, 1000)]
    assert data.counts == COUNTS and data.lateness == lat
