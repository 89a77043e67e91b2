"""The base configuration of every Kafka client the sidecar makes: the bootstrap servers, the
sidecar's librdkafka defaults (:data:`CLIENT_DEFAULTS`), the operator's ``kafka:`` entries, then
what one client adds (a tenant's own ``kafka:`` entries, callbacks, a transactional id), each
later mapping winning. One place, so that no client (the start's probe, a tenant's admin, the
transactional-id probe) misses a default or lets it win over the operator."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sidecar.config import Settings

# librdkafka spaces a client's connection attempts by half its reconnect.backoff.ms (11 ms at
# least). A new client's bootstrap connection answers the first metadata request, is dropped, and
# the broker is connected again under its node id: with the default 100 ms, 50 ms after. Every
# client of a start paid that once (the probe's admin, the topics' admin, the consumer, the
# producer): at 10 ms the start's two metadata checks take 45 ms instead of 125 on a local broker.
# The backoff still doubles up to reconnect.backoff.max.ms (10 s) while a broker stays away; a
# ``kafka:`` entry overrides it.
CLIENT_DEFAULTS: dict[str, Any] = {"reconnect.backoff.ms": 10}

# A consumer's fetcher stops fetching a partition whose local queue holds queued.min.messages
# (100k) and looks again fetch.queue.backoff.ms later: 1,000 ms by default. A loop that drains
# a backlog more slowly than the fetcher fills the queue (every backlog drain) empties the queue
# inside that second and waits for the next fetch: a plain consume -> produce drained 82-89k/s
# with it and 110-147k/s with 5-100 ms (local broker, 300k records, three rounds each); 0
# keeps re-checking and costs 2 us of the client's CPU per record. 10 ms, the broker's own
# fetch wait here (fetch.wait.max.ms), never leaves the queue empty for long. Consumer property
# only (a producer logs it as ignored); a ``kafka:`` entry overrides it.
FETCH_QUEUE_BACKOFF_MS = 10


def client_conf(settings: Settings, *over: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """``bootstrap.servers``, :data:`CLIENT_DEFAULTS`, ``settings.kafka``, then each of ``over``
    (a mapping, or pairs: a tenant's ``kafka``)."""
    conf: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers, **CLIENT_DEFAULTS, **settings.kafka}
    for more in over:
        conf.update(dict(more))
    return conf
