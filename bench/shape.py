"""The shapes of ingress records the ``throughput`` and ``lateness`` scenarios send.

``plain``: the bench's original shape. One ingress partition; each record carries only the two
headers that schedule it (``delay.target-topic`` and ``delay.ms``), so the sidecar makes its id.

``common``: what a user's producer sends (issue 54). Records keyed by a unique key on a
``COMMON_PARTITIONS``-partition ingress topic (the producer's partitioner spreads them over every
partition, so one sidecar runs that many partition stores), each with an explicit ``delay.id``
and one application header (``USER_HEADER``, 16 bytes, a trace id) beside the two schedule
headers; the sidecar keeps the user header and copies it onto the delivered record, as the
passthrough does. 100 B values, as the issue's measurement.

Which shapes run: ``--shape`` (``plain``, ``common`` or both). Without it a full run measures both
and a small one only ``plain``: the CI smoke test runs ``--size small`` and its time must not
double; a small run of the common shape alone is ``--shape common``.
"""

from __future__ import annotations

from bench.workload import Bench, KHeaders
from sidecar import contract as c

PLAIN = "plain"
COMMON = "common"
SHAPES = (PLAIN, COMMON)
COMMON_PARTITIONS = 3
COMMON_VALUE_BYTES = 100
USER_HEADER = "trace-id"


def shapes_for(bench: Bench) -> list[str]:
    """The shapes this run measures (see the module docstring)."""
    asked: list[str] | None = bench.options.get("shapes")
    if asked:
        return asked
    return list(SHAPES) if bench.full else [PLAIN]


def common_headers(i: int) -> KHeaders:
    """Record ``i``'s headers beside the schedule ones: its own ``delay.id`` and a user header."""
    return [(c.ID, b"order-%d" % i), (USER_HEADER, b"%016x" % i)]


def describe() -> dict[str, object]:
    """The common shape, for a scenario's ``settings``."""
    return {"ingress_partitions": COMMON_PARTITIONS, "target_partitions": COMMON_PARTITIONS,
            "record_bytes": COMMON_VALUE_BYTES, "headers": [c.TARGET_TOPIC, c.DELAY_MS, c.ID, USER_HEADER]}
