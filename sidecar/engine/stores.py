"""The key of the loop's stores map: which store a consumed record or an assigned partition is for.

Today one ingress topic feeds the sidecar, so a store is named by its ingress partition alone.
Every engine module that keeps something per store (the stores map ``Stores``, the page waits,
the restore's skips, the look-up's partition filter) keys it by :data:`StoreKey` and gets a key
only from the two functions here. Serving several ingress topics in one group (the tenants
issue) widens the key to the topic and the partition here; mypy then names every place that
still takes a bare partition.
"""

from __future__ import annotations

from typing import Any

from sidecar.store.partition import PartitionStore

StoreKey = int  # the ingress partition
Stores = dict[StoreKey, PartitionStore]  # the stores the loop owns (open, restored, publishing)


def record_key(msg: Any) -> StoreKey:
    """The store a consumed ingress record goes to."""
    return int(msg.partition())


def store_key(store: PartitionStore) -> StoreKey:
    """The key ``store`` is held under."""
    return store.partition
