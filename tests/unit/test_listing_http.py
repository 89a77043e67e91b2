"""``GET /pending``: the query's wire form (``sidecar.store.listing_params``), the health server's route,
and ``Sidecar.listing`` answering from another thread while the loop runs (``sidecar.engine.listing``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.engine import listing as engine_listing
from sidecar.health import HealthServer
from sidecar.metrics import Metrics
from sidecar.store.listing import Budget, Query
from sidecar.store.listing_params import from_params, parse_cursor, to_params
from tests.unit.helpers.http import get
from tests.unit.helpers.world import World


def test_query_round_trips_through_the_query_string() -> None:
    q = Query(5, 10, "orders", b"a/b&c\xff", 7, (6, 2, 1 << 62 | 5))
    assert from_params(to_params(q)) == q
    assert from_params("after=1&before=2") == Query(1, 2)
    assert parse_cursor("6.2.9") == (6, 2, 9)


@pytest.mark.parametrize(("params", "named"), [
    ("before=5", "after="), ("after=1&before=x", "before="), ("after=5&before=5", "due-before"),
    ("after=1&before=5&limit=0", "limit"), ("after=1&before=5&limit=x", "limit="),
    ("after=1&before=5&cursor=1-2", "cursor"), ("after=1&before=5&id_prefix=", "id-prefix"),
    ("after=1&before=5&target=", "target"),
])
def test_bad_parameters_are_named(params: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        from_params(params)


def test_health_server_routes_pending_to_its_listing() -> None:
    asked: list[str] = []
    with HealthServer("127.0.0.1", 0, Metrics()) as h:
        status, doc = get(h, "/pending?after=1&before=2")
        assert status == 404 and "no stores" in doc["error"]
        def listing(qs: str) -> tuple[int, dict[str, Any]]:
            asked.append(qs)
            return 200, {"entries": []}

        h.listing = listing
        assert get(h, "/pending/?after=1&before=2") == (200, {"entries": []})
    assert asked == ["after=1&before=2"]


def test_sidecar_listing_from_another_thread_while_the_loop_runs(tmp_path: Path) -> None:
    """Pages asked from another thread while the loop delivers (on the in-memory Kafka twin): every
    page is in due order, holds only ids still pending at that moment or just delivered, and the
    last one (all delivered) is empty."""
    w = World(tmp_path)
    sc = w.sidecar("a")
    w.send(400, lambda i: 200 + 10 * i)
    w.run([sc], lambda: sum(sum(s.pending().values()) for s in sc.stores.values()) == 400)
    lo, hi = w.clock.now_ms, w.clock.now_ms + 10_000
    status, doc = sc.listing(f"after={lo}&before={hi}&limit=1000")
    assert status == 200 and len(doc["entries"]) == 400 and "next" not in doc
    assert [e["id"] for e in doc["entries"]] == [f"r{i}" for i in range(400)]
    assert {e["partition"] for e in doc["entries"]} == {0, 1, 2, 3} and doc["owned_partitions"] == [0, 1, 2, 3]
    status, doc = sc.listing(f"after={lo}&before={hi}&limit=150")
    assert len(doc["entries"]) == 150 and doc["next"]
    status, doc2 = sc.listing(f"after={lo}&before={hi}&limit=1000&cursor={doc['next']}")
    assert [e["id"] for e in doc2["entries"]] == [f"r{i}" for i in range(150, 400)]
    assert sc.listing("after=1")[0] == 400
    with pytest.MonkeyPatch.context() as mp:  # a budget that a filter rejecting everything exhausts
        mp.setattr(engine_listing, "Budget", lambda total=0: Budget(50))
        status, doc = sc.listing(f"after={lo}&before={hi}&target=nowhere")
    assert status == 422 and "narrow --due-after/--due-before" in doc["error"]
    seen: list[list[dict[str, Any]]] = []

    def ask() -> None:
        status, doc = sc.listing(f"after={lo}&before={hi}&limit=50")
        assert status == 200, doc
        seen.append(doc["entries"])

    w.run_beside(sc, ask, lambda: len(w.delivered()) >= 400)
    assert seen and any(page for page in seen)
    for page in seen:
        keys = [(e["due_ms"], e["partition"], e["ref"]) for e in page]
        assert keys == sorted(keys)
        assert all(e["due_ms"] == w.sent[e["id"].encode()] for e in page)
    assert sc.listing(f"after={lo}&before={hi}")[1]["entries"] == []
    sc.shutdown()
