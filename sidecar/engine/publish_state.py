"""The loop state the publish path reads and writes, declared once: ``PublishState``.

The loop publishes a due batch through two paths that interleave record by record: the C fast
path (``_native.publish_due`` and its ``Delivery`` reports, sidecar/native/publish.c) for the
plain records, and the reference path (``Publishing._produce`` / ``_on_delivery``,
engine/publishing.py) for everything else. Both read and write the same state, held in one
``PublishState`` object that ``Publishing`` keeps (``Publishing.state``) and hands to
``_native.Publisher``. With the extension built, ``PublishState`` is
the C type ``_native.PublishState``: its fields are members of a C struct, which C reads and
writes directly and Python as attributes; ``in_flight`` is a C integer there. Without it
(``KDS_PURE_PYTHON=1``, or no compiler) it is the twin below, a class with the same fields as
slots (tests/unit/test_publish_state.py checks the two have the same fields and start alike).

Fields:

- ``in_flight``: records produced whose delivery report has not run yet (the loop's
  ``max-in-flight`` bound). Exact at every moment.
- ``topic_in_flight``: target topic -> its records in flight, a topic gone at 0 (the cap on a
  troubled target). The C path adds its changes at ``Publisher.sync``, which the loop calls after
  every producer poll; a delivery report of the reference path inside a poll subtracts from counts
  that still include the C path's, so no count reaches zero early.
- ``troubled``: target topic -> when its last publish failed (epoch ms); cleared by its next
  success. While any target is troubled, C hands every record to the reference path.
- ``broker_up``: False from a sign of a broker outage until the next successful delivery (a
  bool; the C type refuses anything else).
- ``stores``: partition -> its ``PartitionStore``, the assigned partitions; a delivery report
  whose store is no longer there (revoked) only counts down.
- ``counters``: the loop's own ``Counters`` (C counts ``early`` there; engine/tenant_counts.py).

A delivery's lateness (delivery timestamp - due time, ms) goes to its store's ``lateness`` list,
its tenant's (engine/tenant_counts.py), until the metrics take it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.store.codec import NATIVE, native

if TYPE_CHECKING:
    from sidecar.engine.stores import Stores
    from sidecar.store.partition import Counters


class PublishState:
    """The Python twin of ``_native.PublishState`` (see the module docstring)."""

    __slots__ = ("broker_up", "counters", "in_flight", "stores", "topic_in_flight", "troubled")

    in_flight: int
    topic_in_flight: dict[str, int]
    troubled: dict[str, int]
    broker_up: bool
    stores: Stores
    counters: Counters

    def __init__(self, stores: Stores, counters: Counters) -> None:
        self.in_flight = 0
        self.topic_in_flight = {}
        self.troubled = {}
        self.broker_up = True
        self.stores = stores
        self.counters = counters


PyPublishState = PublishState
if NATIVE:
    PublishState = native.PublishState  # type: ignore[misc]
