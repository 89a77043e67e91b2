"""The timer-wheel scheduler (RIP-43 improved): see ``sidecar.wheel.scheduler`` and docs/wheel.md."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.store.log import CommitLog
from sidecar.wheel.scheduler import WheelScheduler, check_settings

if TYPE_CHECKING:
    from sidecar.config import Settings

__all__ = ["WheelScheduler", "make_wheel"]


def make_wheel(settings: Settings) -> Callable[[Path, CommitLog], WheelScheduler]:
    """A factory for one partition's wheel, from ``wheel_precision_ms``, ``wheel_window_ms``,
    ``bucket_width_ms`` and ``levels_ms``. The geometry is checked here, at start-up."""
    precision, window, width = settings.wheel_precision_ms, settings.wheel_window_ms, settings.bucket_width_ms
    check_settings(precision, window, width)
    levels = tuple(settings.levels_ms)

    def factory(directory: Path, log: CommitLog) -> WheelScheduler:
        return WheelScheduler(
            directory, log, precision_ms=precision, window_ms=window, bucket_width_ms=width, levels_ms=levels,
        )

    return factory
