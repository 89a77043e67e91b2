"""``delay-sidecar status ID``: find the sidecar that owns an id's partition and ask it.

The answer lives in one process: the owner of the ingress partition the id's record went to
(docs/design.md 7.3). Every sidecar is a member of the ingress consumer group, so the group's
description (``AdminClient.describe_consumer_groups``) says which member holds which partition.
What it does not say is where that member's HTTP server listens, so each sidecar advertises it in
its consumer's ``client.id``: ``<client.id>@<HOST:PORT>``, from ``advertised-address``, or
``<client.id>@:<http-port>`` when that is unset, which means "the host the broker sees this client
at" (the member description's ``host``: the pod IP in Kubernetes), with the HTTP port. A sidecar
with ``http-port: 0`` advertises nothing and cannot be asked.

Which members are asked:

- ``--partition P``: the member that owns partition P.
- ``--key K``: the partition the key goes to, by the producer's partitioner: ``crc32`` is
  librdkafka's default (``consistent_random``: CRC-32 of the key modulo the partition count),
  used by confluent-kafka, ``sidecar.client`` and ``delay-sidecar send``; ``murmur2`` is the Java
  client's default (murmur2 of the key, sign bit cleared, modulo the partition count).
- an id in the default form ``<ingress-topic>:<partition>:<offset>``: that partition.
- otherwise every member, each asked about all of its partitions; the first that knows the id
  answers.

The client id is the member's as it *joined*: a static member (``group.instance.id``, kept in the
data directory) that restarts within its session timeout replaces its old self, and the broker
keeps the old client id and host — an advertised address that changed (a new pod IP, another
``http-port``) would not show. So each owner also writes its address into the metadata of every
offset commit of its partitions (``KafkaIO.commit``; at every checkpoint, so within a commit
interval of taking a partition): for a partition's owner the committed metadata's address wins,
when the group's committed offsets have one (``committed_addresses``).

A member answers from its stores (``GET /ids/<id>?partition=P&topic=T``; ``Sidecar.lookup``): one
id-index probe, verified against the stored record's id, then its memory of recent outcomes. The
partition is the ingress topic's (``--ingress-topic``, or ``--tenant``'s from the configuration),
so the member looks in that topic's stores only: tenants' topics share partition numbers and a
member may hold the same number of several.
"""

from __future__ import annotations

import http.client
import re
import socket
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson

from sidecar.config import Settings

BASE_CLIENT_ID = "delay-sidecar"
PARTITIONERS = ("crc32", "murmur2")


class StatusError(Exception):
    """The question could not be answered (no group, no owner, no member answering)."""


def advertised_client_id(s: Settings) -> str:
    """The consumer's ``client.id``: the configured one (``kafka: client.id``) or
    ``delay-sidecar``, with ``@<address>`` when the HTTP server runs."""
    base = s.kafka.get("client.id") or BASE_CLIENT_ID
    if not s.http_port:
        return base
    return f"{base}@{s.advertised_address or f':{s.http_port}'}"


def own_address(s: Settings) -> str | None:
    """The HOST:PORT this sidecar puts in its commits' metadata: ``advertised-address``, or the
    local address it reaches the first bootstrap server from (a UDP connect sends nothing), with
    ``http-port``; None when the HTTP server does not run."""
    if not s.http_port:
        return None
    if s.advertised_address:
        return s.advertised_address
    first = (s.bootstrap_servers or "").split(",")[0].strip()
    host, _, port = first.rpartition(":")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_DGRAM) as sk:
            sk.connect((host.strip("[]") or "127.0.0.1", int(port or 9092)))
            ip = sk.getsockname()[0]
    except (OSError, ValueError):
        return None
    return f"[{ip}]:{s.http_port}" if ":" in ip else f"{ip}:{s.http_port}"


def committed_addresses(admin: Any, group: str, topic: str, partitions: set[int], timeout_s: float) -> dict[int, str]:
    """The address each partition's last committer wrote in the commit's metadata (``own_address``);
    partitions without one are left out (a sidecar that does not run the HTTP server, or an older
    one). Best effort: no answer is no addresses."""
    try:
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in sorted(partitions)])
        res = admin.list_consumer_group_offsets([req], request_timeout=timeout_s)[group].result(timeout=timeout_s)
    except Exception:
        return {}
    out = {}
    for tp in res.topic_partitions:
        meta = tp.metadata or ""
        if tp.error is None and re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^@\s:]+):[0-9]{1,5}", meta):
            out[tp.partition] = meta
    return out


def member_address(client_id: str, host: str) -> str | None:
    """The HOST:PORT a member advertises in its ``client_id`` (``host``: the member description's,
    used for an advertised ``:PORT``); None when it advertises nothing."""
    _base, at, addr = client_id.rpartition("@")
    if not at or not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^@\s:]*):[0-9]{1,5}", addr):
        return None
    if addr.startswith(":"):
        seen = host.lstrip("/")
        if not seen:
            return None
        return f"[{seen}]{addr}" if ":" in seen else f"{seen}{addr}"
    return addr


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's ``consistent_random``/``consistent`` partitioner for a non-empty key."""
    return zlib.crc32(key) % partitions


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (the Java client's partitioner hash), as an unsigned 32-bit int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    end = length & ~3
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    extra = length & 3
    if extra == 3:
        h ^= data[end + 2] << 16
    if extra >= 2:
        h ^= data[end + 1] << 8
    if extra >= 1:
        h ^= data[end]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partitioner for a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def key_partition(key: bytes, partitions: int, partitioner: str) -> int:
    if partitioner == "murmur2":
        return murmur2_partition(key, partitions)
    return crc32_partition(key, partitions)


def default_id_partition(rid: bytes, ingress_topic: str) -> int | None:
    """The partition named by an id of the default form ``<ingress-topic>:<partition>:<offset>``."""
    m = re.fullmatch(re.escape(ingress_topic.encode()) + rb":([0-9]{1,9}):[0-9]+", rid)
    return int(m.group(1)) if m else None


@dataclass
class Member:
    member_id: str
    client_id: str
    host: str
    address: str | None
    partitions: set[int] = field(default_factory=set)


def group_members(admin: Any, group: str, topic: str, timeout_s: float) -> list[Member]:
    """The members of ``group`` holding partitions of ``topic``, each with the address it
    advertises: the one its partitions' last commits name (all the same: it owns them), else its
    client id's."""
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result(timeout=timeout_s)
    except Exception as e:
        raise StatusError(f"could not describe consumer group {group!r} (--group): {e}") from None
    out = []
    for m in desc.members:
        parts = {tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic}
        if parts:
            out.append(Member(m.member_id, m.client_id, m.host, member_address(m.client_id, m.host), parts))
    if out:
        committed = committed_addresses(admin, group, topic, {p for m in out for p in m.partitions}, timeout_s)
        for m in out:
            named = {committed[p] for p in m.partitions if p in committed}
            if len(named) == 1:
                m.address = named.pop()
    if not out:
        state = getattr(desc.state, "name", desc.state)
        raise StatusError(f"consumer group {group!r} (--group) has no member holding partitions of {topic!r} "
                          f"(--ingress-topic); group state {state}: is a sidecar running with --group-id {group}?")
    return out


def ask(address: str, rid: bytes, partition: int | None, timeout_s: float,
        topic: str | None = None) -> tuple[int, dict[str, Any]]:
    """``GET http://<address>/ids/<id>[?partition=P][&topic=T]`` -> (status, JSON document)."""
    query = []
    if partition is not None:
        query.append(f"partition={partition}")
    if topic:
        query.append("topic=" + quote(topic, safe=""))
    path = "/ids/" + quote(rid, safe="") + ("?" + "&".join(query) if query else "")
    return get_json(address, path, timeout_s)


def get_json(address: str, path: str, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """``GET http://<address><path>`` -> (status, JSON document: an error's text when not JSON)."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = {"error": body[:200].decode("utf-8", "replace")}
    return resp.status, doc if isinstance(doc, dict) else {"error": str(doc)}


def find(
    members: list[Member], rid: bytes, partition: int | None, group: str, timeout_s: float,
    topic: str | None = None,
) -> dict[str, Any]:
    """Ask the owner of ``partition`` (or every member) about ``rid``, in the stores of ingress
    topic ``topic`` (None: every topic's): the first document with a known state, else ``state:
    unknown``. Raises StatusError when no member could answer."""
    if partition is not None:
        owners = [m for m in members if partition in m.partitions]
        if not owners:
            held = sorted(p for m in members for p in m.partitions)
            raise StatusError(f"partition {partition} has no owner in group {group!r} (owned: {held}); "
                              "a rebalance in progress, or a partition the ingress topic does not have")
        asked = owners
    else:
        asked = members
    silent = [m for m in asked if m.address is None]
    reachable = [m for m in asked if m.address is not None]
    if not reachable:
        m = silent[0]
        raise StatusError(f"member {m.client_id!r} ({m.host}) advertises no HTTP address: run the sidecars "
                          "with --http-port (and --advertised-address if the broker sees them at another host)")

    def one(m: Member) -> tuple[Member, int, dict[str, Any]] | tuple[Member, Exception]:
        assert m.address is not None
        try:
            return (m, *ask(m.address, rid, partition, timeout_s, topic))
        except (OSError, http.client.HTTPException) as e:
            return m, e

    if len(reachable) == 1:  # the usual case (an owner): no thread pool to start
        results = [one(reachable[0])]
    else:
        with ThreadPoolExecutor(max_workers=min(16, len(reachable))) as pool:
            results = list(pool.map(one, reachable))
    failures = []
    unknown: dict[str, Any] | None = None
    for r in results:
        if len(r) == 2:
            failures.append(f"{r[0].address}: {r[1]}")
            continue
        m, status, doc = r
        doc["member"] = m.address
        if status == 200:
            return doc
        if status == 404 and doc.get("state") == "unknown":
            unknown = doc
        else:
            failures.append(f"{m.address}: HTTP {status} {doc.get('error', '')}".strip())
    if failures:
        # an unknown from some members is not an answer while another that may hold it failed
        raise StatusError("no answer from " + "; ".join(failures) + (
            f" (members advertising no address: {', '.join(m.client_id for m in silent)})" if silent else ""))
    if silent:
        raise StatusError(f"unknown to the members asked, and {len(silent)} member(s) advertise no HTTP address "
                          f"({', '.join(m.client_id for m in silent)}): run every sidecar with --http-port")
    assert unknown is not None
    unknown.pop("member", None)
    unknown.pop("owned_partitions", None)
    unknown.pop("instance", None)
    if partition is not None:
        unknown["partition"] = partition
    return unknown
