"""The state the publish path shares with the C accelerator, declared in one place.

``_native.Publisher`` (the C publish path, ``publish_due`` and its delivery reports) reads and
updates these fields for every plain record; the Python reference path in ``publishing.py``
uses the same object, so both always see one state:

- ``in_flight``: records handed to the producer and not yet reported, across partitions;
- ``topic_in_flight``: the same per target topic (a failing target is capped: ``publishing.py``);
- ``troubled``: target topics whose last publish failed -> when (epoch ms);
- ``broker_up``: False after a transport failure until a delivery or the statistics say otherwise;
- ``stores``: the owned partitions' stores by partition (a report for a revoked one is dropped);
- ``lateness_batch``: lateness of the deliveries since the last metrics sync (ms);
- ``counters``: the process's counters (``early`` is bumped by the C delivery report).
"""

from __future__ import annotations

from typing import Any


class PublishState:
    def __init__(self, stores: dict[int, Any], counters: Any) -> None:
        self.in_flight = 0
        self.topic_in_flight: dict[str, int] = {}
        self.troubled: dict[str, int] = {}
        self.broker_up = True
        self.stores = stores
        self.lateness_batch: list[int] = []
        self.counters = counters
