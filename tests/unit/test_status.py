"""The pieces of ``delay-sidecar status`` that need no broker: partitioners, the advertised
address, the ``/ids/<id>`` endpoint's request checks."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.config import ConfigError, Settings, load_settings
from sidecar.health import HealthServer
from sidecar.metrics import Metrics
from sidecar.status import (
    advertised_client_id,
    default_id_partition,
    member_address,
    murmur2,
    murmur2_partition,
)
from tests.unit.helpers.http import get


def signed(h: int) -> int:
    return h - (1 << 32) if h >= 1 << 31 else h


def test_murmur2_matches_kafkas_own_test_vectors() -> None:
    """The values of Kafka's UtilsTest.testMurmur2 (Java ints)."""
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829,
             b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
    for data, want in cases.items():
        assert signed(murmur2(data)) == want, data
    assert murmur2_partition(b"foobar", 7) == (-790332482 & 0x7FFFFFFF) % 7


def test_advertised_address_in_the_client_id() -> None:
    assert advertised_client_id(Settings()) == "delay-sidecar"  # no HTTP server: nothing to advertise
    assert advertised_client_id(Settings(http_port=9404)) == "delay-sidecar@:9404"
    s = Settings(http_port=9404, advertised_address="sc-0.sc:9404", kafka={"client.id": "billing"})
    assert advertised_client_id(s) == "billing@sc-0.sc:9404"
    assert member_address("delay-sidecar@:9404", "/10.1.2.3") == "10.1.2.3:9404"
    assert member_address("delay-sidecar@:9404", "/fe80::1") == "[fe80::1]:9404"
    assert member_address("billing@sc-0.sc:9404", "/10.1.2.3") == "sc-0.sc:9404"
    assert member_address("delay-sidecar", "/10.1.2.3") is None
    assert member_address("someone@else", "/10.1.2.3") is None
    with pytest.raises(ConfigError, match="--advertised-address"):
        load_settings(flags={"advertised-address": "no-port"}, environ={})


def test_default_id_names_its_partition() -> None:
    assert default_id_partition(b"delay.ingress:4:1234", "delay.ingress") == 4
    assert default_id_partition(b"delay.ingress:4:x", "delay.ingress") is None
    assert default_id_partition(b"order-42", "delay.ingress") is None
    assert default_id_partition(b"delayXingress:4:1", "delay.ingress") is None  # the dot is not a wildcard


@pytest.fixture
def server() -> Any:
    h = HealthServer("127.0.0.1", 0, Metrics(ingress_topic="in", scheduler="wheel"))
    h.start()
    yield h
    h.stop()


def test_ids_endpoint_decodes_the_id_and_checks_the_request(server: HealthServer) -> None:
    assert get(server, "/ids/x")[0] == 404  # no look-up wired
    asked: list[tuple[bytes, int | None]] = []

    def lookup(rid: bytes, partition: int | None, _topic: str | None) -> tuple[int, dict[str, Any]]:
        asked.append((rid, partition))
        return 200, {"state": "pending"}

    server.lookup = lookup
    assert get(server, "/ids/a%2Fb%20c%FF/") == (200, {"state": "pending"})
    assert get(server, "/ids/k?partition=3")[0] == 200
    assert asked == [(b"a/b c\xff/", None), (b"k", 3)]
    status, doc = get(server, "/ids/k?partition=-1")
    assert status == 400 and "partition" in doc["error"]
    status, doc = get(server, "/ids/" + "x" * 256)
    assert status == 400 and "1..255 bytes" in doc["error"]
    assert len(asked) == 2


def test_find_names_what_is_missing() -> None:
    """No owner for the partition, or an owner that advertises no HTTP address: a clear error
    naming what to change (nothing is asked over the network)."""
    from sidecar.status import Member, StatusError, find

    silent = Member("m1", "delay-sidecar", "/10.0.0.1", None, {0, 1})
    with pytest.raises(StatusError, match="partition 5 has no owner in group 'g'"):
        find([silent], b"x", 5, "g", 1)
    with pytest.raises(StatusError, match="--http-port"):
        find([silent], b"x", 1, "g", 1)


def test_find_asks_the_owner_over_http(server: HealthServer) -> None:
    from sidecar.status import Member, find

    answers = {b"known": (200, {"state": "pending", "partition": 1})}
    server.lookup = lambda rid, partition, topic: answers.get(rid, (404, {"state": "unknown", "error": "no"}))
    owner = Member("m1", f"delay-sidecar@127.0.0.1:{server.port}", "/127.0.0.1", f"127.0.0.1:{server.port}", {1})
    doc = find([owner], b"known", 1, "g", 5)
    assert doc == {"state": "pending", "partition": 1, "member": f"127.0.0.1:{server.port}"}
    assert find([owner], b"other", 1, "g", 5)["state"] == "unknown"
