"""The Redis sorted-set delay queue baseline (Youzan's design, seed summary "Redis ZSET"), on the
same ingress topic and wire contract as the sidecar.

Run as ``python -m bench.redis_worker --bootstrap B --source T --group G --redis-port P
--count N [--intake-only] [--connect-timeout S]``. One process, one loop, like the sidecar's:

1. *intake*: ``consume`` a batch of up to 5 000 ingress records; for each, the due time from
   ``delay.ms`` / ``delay.deliver-at`` (relative to the record timestamp, as the sidecar does; no
   level rounding) and a job body (target topic, key, value, user headers); one pipelined round
   trip per batch: ``HSET jobs id body ...`` (the job pool) + ``ZADD delay due id ...`` (the
   bucket); then the ingress offsets are committed (async, every 200 ms);
2. *timer*: a Lua script moves up to 1 000 due members from the sorted set to the ready list
   atomically (``ZRANGEBYSCORE -inf now LIMIT`` + ``ZREM`` + ``RPUSH``), repeated while it moves
   a full batch and there is room in flight;
3. *worker*: ``LPOP ready 1000`` + ``HMGET jobs ...`` and ``produce`` each job to its target
   topic with the sidecar's producer settings and delivered-record headers
   (``delay.deliver-at``, ``delay.id``); acknowledged jobs are deleted with one ``HDEL`` per turn.

``--intake-only`` stops after step 1 for ``count`` records (the memory measurement). JSON event
lines on stdout: ``ready``, ``done`` (with CPU seconds).
"""

from __future__ import annotations

import argparse
import resource
import struct
import sys
import time
from typing import Any, cast

import orjson
import redis
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bench.workload import CONSUME_BATCH, DELIVERY_PRODUCER, INGRESS_CONSUMER, MAX_IN_FLIGHT, KHeaders
from sidecar import contract as c
from sidecar.store.codec import decode_headers, encode_headers

MOVE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('RPUSH', KEYS[2], unpack(ids))
end
return #ids
"""
ZSET, READY, JOBS = "kds:delay", "kds:ready", "kds:jobs"
MOVE_BATCH = 1_000
_LENS = struct.Struct("<qHii")  # due, topic len, key len (-1 null), value len (-1 null)


def emit(event: str, **kw: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps({"event": event, "ts_ms": time.time_ns() // 1_000_000, **kw}) + b"\n")
    sys.stdout.flush()


def pack(due: int, topic: bytes, key: bytes | None, value: bytes | None, headers: bytes) -> bytes:
    k, v = key or b"", value or b""
    return b"".join((_LENS.pack(due, len(topic), -1 if key is None else len(k), -1 if value is None else len(v)),
                     topic, k, v, headers))


def unpack(body: bytes) -> tuple[int, str, bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    due, tl, kl, vl = _LENS.unpack_from(body, 0)
    pos = _LENS.size
    topic = body[pos:pos + tl].decode()
    pos += tl
    key = None if kl < 0 else body[pos:pos + kl]
    pos += max(kl, 0)
    value = None if vl < 0 else body[pos:pos + vl]
    pos += max(vl, 0)
    return due, topic, key, value, decode_headers(body[pos:])


def job_of(m: Message) -> tuple[str, bytes, int]:
    """An ingress record's job id, body and due time: ``delay.ms`` after its timestamp or
    ``delay.deliver-at``, as the sidecar reads them (no level rounding)."""
    _tt, ts = m.timestamp()
    target = b""
    due = ts
    user: list[tuple[str, bytes | None]] = []
    for k, v in cast(KHeaders, m.headers() or []):
        b = v.encode() if isinstance(v, str) else v
        if k == c.TARGET_TOPIC:
            target = b or b""
        elif k == c.DELAY_MS:
            due = ts + int(b or b"0")
        elif k == c.DELIVER_AT:
            due = int(b or b"0")
        else:
            user.append((k, b))
    return f"{m.topic()}:{m.partition()}:{m.offset()}", pack(due, target, m.key(), m.value(), encode_headers(user)), due


def wait_for(r: redis.Redis, retry_s: float) -> None:
    """PING every 10 ms for ``retry_s`` until Redis answers: refused while it starts, ``LOADING``
    (a ``ConnectionError`` to redis-py) while it reads its append-only file."""
    give_up = time.monotonic() + retry_s
    while True:
        try:
            r.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() >= give_up:
                raise
            time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.redis_worker")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--redis-port", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--intake-only", action="store_true")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--connect-timeout", type=float, default=0,
                    help="keep trying this long while Redis refuses or loads its data (a restart)")
    ns = ap.parse_args(argv)

    r = redis.Redis(host="127.0.0.1", port=ns.redis_port)
    wait_for(r, ns.connect_timeout)
    move = r.register_script(MOVE)
    prod = Producer({"bootstrap.servers": ns.bootstrap, **DELIVERY_PRODUCER})
    cons = Consumer({"bootstrap.servers": ns.bootstrap, "group.id": ns.group, **INGRESS_CONSUMER})
    state = {"in_flight": 0, "acked": 0, "failed": 0}
    finished: list[bytes] = []

    def on_assign(cn: Consumer, parts: list[TopicPartition]) -> None:
        cn.incremental_assign(parts)
        emit("ready", partitions=[p.partition for p in parts])

    cons.subscribe([ns.source], on_assign=on_assign)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    ingested = 0
    positions: dict[int, int] = {}
    last_commit = time.monotonic()
    deadline = time.monotonic() + ns.timeout
    first_ms = 0

    def done_target() -> bool:
        return bool(ingested >= ns.count if ns.intake_only else state["acked"] + state["failed"] >= ns.count)

    while not done_target() and time.monotonic() < deadline:
        # 1. intake
        msgs = cons.consume(num_messages=CONSUME_BATCH, timeout=0.01) if ingested < ns.count else []
        if msgs:
            jobs: dict[str, bytes] = {}
            zs: dict[str, int] = {}
            for m in msgs:
                if m.error() is not None:
                    continue
                jid, job_body, job_due = job_of(m)
                jobs[jid] = job_body
                zs[jid] = job_due
                positions[m.partition()] = m.offset() + 1  # type: ignore[index,operator]
            pipe = r.pipeline(transaction=False)
            pipe.hset(JOBS, mapping=jobs)  # type: ignore[arg-type]
            pipe.zadd(ZSET, zs)
            pipe.execute()
            ingested += len(jobs)
        now = time.monotonic()
        if positions and now - last_commit >= 0.2:
            cons.commit(offsets=[TopicPartition(ns.source, p, o) for p, o in positions.items()], asynchronous=True)
            last_commit = now
        if ns.intake_only:
            continue
        # 2. timer: due members -> ready list
        while state["in_flight"] < MAX_IN_FLIGHT:
            moved = int(move(keys=[ZSET, READY], args=[time.time_ns() // 1_000_000, MOVE_BATCH]))
            if moved < MOVE_BATCH:
                break
        # 3. worker: ready list -> Kafka
        while state["in_flight"] < MAX_IN_FLIGHT:
            ids = cast(list[bytes] | None, r.lpop(READY, min(MOVE_BATCH, MAX_IN_FLIGHT - state["in_flight"])))
            if not ids:
                break
            bodies = cast(list[bytes | None], r.hmget(JOBS, ids))
            for job, body in zip(ids, bodies, strict=True):
                if body is None:
                    continue
                due, topic, key, value, user_headers = unpack(body)
                headers: KHeaders = [*user_headers, (c.ID, job), (c.DELIVER_AT, str(due).encode())]

                def on_delivery(err: Any, _msg: Any, job: bytes = job) -> None:
                    state["in_flight"] -= 1
                    state["failed" if err is not None else "acked"] += 1
                    finished.append(job)

                while True:
                    try:
                        prod.produce(topic, value, key, -1, on_delivery, None, 0, headers)  # positional, as the sidecar
                        break
                    except BufferError:
                        prod.poll(0.01)
                state["in_flight"] += 1
                if not first_ms:
                    first_ms = time.time_ns() // 1_000_000
        prod.poll(0)
        if finished:
            r.hdel(JOBS, *finished)
            finished.clear()
    prod.flush(60)
    if finished:
        r.hdel(JOBS, *finished)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    emit("done", ingested=ingested, acked=state["acked"], failed=state["failed"], first_produce_ms=first_ms,
         cpu_s=ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime)
    cons.close()
    return 0 if done_target() else 1


if __name__ == "__main__":
    sys.exit(main())
