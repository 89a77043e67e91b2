"""``delay-sidecar``: the one console script.

Subcommands: ``run`` (the sidecar), ``dev-kafka`` (a local single-node KRaft broker), ``send`` and
``cancel`` (client helpers), ``inspect`` (a data directory, read-only), ``salvage`` (copy readable
records out of a damaged store), ``demo`` (the README quickstart), ``accuracy`` (the Spark
accuracy job), ``bench`` (benchmarks, JSON report).

Errors name the bad flag and value and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import orjson

from sidecar import contract as c
from sidecar import devtools
from sidecar.config import OPTIONS, ConfigError, Settings, load_settings


class CliError(Exception):
    pass


def _run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run the sidecar", description="Run the sidecar. Every flag can also be "
                       "set as DELAY_SIDECAR_<FLAG> or in the YAML --config file; flags win.")
    p.add_argument("--config", metavar="FILE", help="YAML config file (keys: the flag names; kafka: librdkafka props)")
    for opt in OPTIONS:
        default = opt.default if not isinstance(opt.default, tuple) else " ".join(map(str, opt.default))
        p.add_argument(f"--{opt.name}", dest=opt.name.replace("-", "_"), metavar="VALUE",
                       help=f"{opt.help} (default: {default})")
    p.add_argument("--kafka", action="append", default=[], metavar="PROP=VALUE",
                   help="librdkafka property for every client (repeatable)")


def _settings_from_args(ns: argparse.Namespace) -> Settings:
    flags: dict[str, Any] = {opt.name: getattr(ns, opt.name.replace("-", "_")) for opt in OPTIONS}
    kafka: dict[str, str] = {}
    for item in ns.kafka:
        if "=" not in item:
            raise ConfigError(f"--kafka expects PROP=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        kafka[k.strip()] = v
    if kafka:
        flags["kafka"] = kafka
    return load_settings(flags, config_file=ns.config)


def _free_port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


def cmd_run(ns: argparse.Namespace) -> int:
    from sidecar import logs

    settings = _settings_from_args(ns)
    logs.setup(settings.log_level)
    log = logs.get("sidecar")
    broker = None
    if not settings.bootstrap_servers:
        LocalKafka = devtools.load("devkafka.local", "an embedded broker (no --bootstrap-servers)").LocalKafka

        data = settings.data_path / "_embedded-kafka"
        data.mkdir(parents=True, exist_ok=True)
        broker = LocalKafka(port=_free_port(9092), data_dir=data)
        settings.bootstrap_servers = broker.start()
        log.info("embedded_kafka.started", bootstrap=settings.bootstrap_servers, data_dir=str(data))
    try:
        return _serve(settings)
    finally:
        if broker is not None:
            broker.stop()


def _serve(settings: Settings, ready: threading.Event | None = None, stop: threading.Event | None = None,
           holder: list[Any] | None = None) -> int:
    from sidecar.engine.loop import Sidecar
    from sidecar.health import HealthServer
    from sidecar.metrics import Metrics

    metrics = Metrics(ingress_topic=settings.ingress_topic, scheduler=settings.scheduler)
    health = None
    if settings.http_port:
        health = HealthServer(settings.http_host, settings.http_port, metrics)
        health.start()
    sidecar = Sidecar(settings, metrics=metrics, health=health)
    if holder is not None:
        holder.append(sidecar)
    if stop is None:
        sidecar.install_signal_handlers()
    else:
        def stopper() -> None:
            stop.wait()
            sidecar.stop_requested = True

        threading.Thread(target=stopper, daemon=True).start()
    if ready is not None:
        ready.set()
    try:
        return sidecar.run()
    finally:
        if health is not None:
            health.stop()


def cmd_dev_kafka(ns: argparse.Namespace) -> int:
    main_dev_kafka = devtools.load("devkafka.local", "dev-kafka").main_dev_kafka

    return int(main_dev_kafka(ns.port, Path(ns.data_dir) if ns.data_dir else None))


def _producer(bootstrap: str | None) -> Any:
    from confluent_kafka import Producer

    bs = bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or os.environ.get("DELAY_SIDECAR_BOOTSTRAP_SERVERS")
    if not bs:
        raise CliError("--bootstrap-servers is required (or set KAFKA_BOOTSTRAP_SERVERS)")
    return Producer({"bootstrap.servers": bs, "enable.idempotence": True, "acks": "all"})


def _flush(producer: Any, what: str) -> int:
    left = producer.flush(30)
    if left:
        print(f"delay-sidecar: {left} {what} not acknowledged by the broker within 30 s", file=sys.stderr)
        return 1
    return 0


def cmd_send(ns: argparse.Namespace) -> int:
    from sidecar import client

    given = [n for n, v in (("--delay", ns.delay), ("--at", ns.at), ("--level", ns.level)) if v is not None]
    if len(given) > 1:
        raise CliError(f"give at most one of --delay, --at, --level (got {', '.join(given)})")
    try:
        headers = client.delay_headers(
            ns.topic, delay=ns.delay, at=ns.at, level=ns.level, id=ns.id, target_partition=ns.partition
        )
    except ValueError as e:
        flag = given[0] if given else "--id"
        raise CliError(f"{flag}: {e}") from None
    extra: list[tuple[str, bytes]] = []
    for item in ns.header:
        if "=" not in item:
            raise CliError(f"--header expects NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        extra.append((k, v.encode()))
    p = _producer(ns.bootstrap_servers)
    errors: list[str] = []
    p.produce(ns.ingress_topic, value=ns.value.encode() if ns.value is not None else None,
              key=ns.key.encode() if ns.key is not None else None, headers=extra + headers,
              on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    rc = _flush(p, "record")
    if errors:
        print(f"delay-sidecar send: {errors[0]}", file=sys.stderr)
        return 1
    return rc


def cmd_cancel(ns: argparse.Namespace) -> int:
    from sidecar import client

    p = _producer(ns.bootstrap_servers)
    client.cancel(p, ns.id, key=ns.key.encode() if ns.key is not None else None, ingress_topic=ns.ingress_topic)
    return _flush(p, "cancel")


def cmd_inspect(ns: argparse.Namespace) -> int:
    from sidecar.inspect import inspect_data_dir, render_text

    root = Path(ns.data_dir)
    if not root.is_dir():
        raise CliError(f"DATA_DIR {root} is not a directory")
    report = inspect_data_dir(root)
    if ns.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(render_text(report))
    return 0


def cmd_demo(ns: argparse.Namespace) -> int:
    """Start a local broker and a sidecar, send a few delayed records, print them arriving."""
    import tempfile
    import uuid

    from confluent_kafka import Consumer

    from sidecar import client

    LocalKafka = devtools.load("devkafka.local", "the demo").LocalKafka

    workdir = Path(tempfile.mkdtemp(prefix="delay-sidecar-demo-"))
    print(f"starting a local Kafka broker (KRaft) in {workdir} ...", flush=True)
    with LocalKafka(port=0, data_dir=workdir / "kafka") as broker:
        bootstrap = broker.start()
        print(f"broker up at {bootstrap}", flush=True)
        settings = load_settings({"bootstrap-servers": bootstrap, "data-dir": str(workdir / "store"),
                                  "scheduler": ns.scheduler, "ingress-partitions": "1", "log-level": "warning"},
                                 environ={})
        stop = threading.Event()
        ready = threading.Event()
        holder: list[Any] = []
        t = threading.Thread(target=_serve, args=(settings, ready, stop, holder), daemon=True)
        from sidecar import logs

        logs.setup("warning")
        t.start()
        ready.wait(30)
        deadline = time.time() + 60
        while not holder[0].assigned and time.time() < deadline:  # joined the group: ready to ingest
            time.sleep(0.05)
        target = f"demo.target.{uuid.uuid4().hex[:6]}"
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference until the result
        admin.create_topics([NewTopic(target, 1, 1)])[target].result(30)
        p = _producer(bootstrap)
        plan = [("in 1 s", {"delay": "1s"}), ("in 3 s", {"delay": "3s"}), ("level 1 (1s)", {"level": 1}),
                ("level 2 (5s)", {"level": 2}), ("at now+2.5 s", {"at": int(time.time() * 1000) + 2500}),
                ("cancelled", {"delay": "4s", "id": "demo-cancel-me"})]
        sent_at = {}
        for i, (label, kw) in enumerate(plan):
            client.send_delayed(p, target, f"message {i}: {label}".encode(), key=b"demo", **kw)  # type: ignore[arg-type]
            sent_at[i] = time.time()
        client.cancel(p, "demo-cancel-me", key=b"demo")
        p.flush(10)
        print(f"sent {len(plan)} delayed records to {settings.ingress_topic} (one then cancelled); "
              f"waiting for them on {target} ...", flush=True)
        cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest"})
        cons.subscribe([target])
        got = 0
        deadline = time.time() + 20
        while got < len(plan) - 1 and time.time() < deadline:
            m = cons.poll(0.2)
            if m is None or m.error():
                continue
            h: dict[str, Any] = dict(cast(Any, m.headers()) or [])
            due = int(h[c.DELIVER_AT])
            lateness = m.timestamp()[1] - due
            got += 1
            print(f"  arrived: {cast(bytes, m.value()).decode():<32} deliver-at={due} lateness={lateness} ms "
                  f"id={h[c.ID].decode()}", flush=True)
        cons.close()
        print(f"{got} of {len(plan) - 1} expected records arrived; the cancelled one did not.", flush=True)
        stop.set()
        t.join(60)
        del p, cons, admin, holder  # close every client before the broker goes away
        import gc

        gc.collect()
    return 0 if got == len(plan) - 1 else 1


def cmd_accuracy(argv: list[str]) -> int:
    from spark.cli import accuracy_main  # type: ignore[import-not-found,unused-ignore]

    return int(accuracy_main(argv))


def cmd_bench(argv: list[str]) -> int:
    return int(devtools.load("bench.cli", "bench").bench_main(argv))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="delay-sidecar", description="Delayed delivery for Kafka.")
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)

    p = sub.add_parser("dev-kafka", help="start a local single-node KRaft broker and keep it running")
    p.add_argument("--port", type=int, default=9092)
    p.add_argument("--data-dir", default=None)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--bootstrap-servers", default=None)
    common.add_argument("--ingress-topic", default=os.environ.get("DELAY_SIDECAR_INGRESS_TOPIC", "delay.ingress"))

    p = sub.add_parser("send", parents=[common], help="send one delayed record")
    p.add_argument("--topic", required=True, help="target topic")
    p.add_argument("--delay", help="e.g. 500ms, 5s, 10m")
    p.add_argument("--at", help="epoch ms or ISO-8601 with a zone")
    p.add_argument("--level", type=int, help="1-based delay level")
    p.add_argument("--value", required=True)
    p.add_argument("--key")
    p.add_argument("--id")
    p.add_argument("--partition", type=int, help="explicit target partition")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")

    p = sub.add_parser("cancel", parents=[common], help="cancel a pending record by its delay.id")
    p.add_argument("id")
    p.add_argument("--key", required=True, help="the message's key (routes the cancel to its partition)")

    p = sub.add_parser("inspect", help="describe a data directory (read-only)")
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("demo", help="local broker + sidecar + a few delayed records, printed as they arrive")
    p.add_argument("--scheduler", default="wheel", choices=["levels", "wheel"])

    sub.add_parser("salvage", help="copy every readable record out of a damaged store (JSON lines)", add_help=False)
    sub.add_parser("accuracy", help="Spark accuracy report (see delay-sidecar accuracy --help)", add_help=False)
    sub.add_parser("bench", help="benchmarks writing a JSON report (see delay-sidecar bench --help)", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "salvage":
        from sidecar.store.salvage import salvage_main

        return int(salvage_main(args[1:]))
    if args and args[0] in ("accuracy", "bench"):
        try:
            return cmd_accuracy(args[1:]) if args[0] == "accuracy" else cmd_bench(args[1:])
        except (CliError, ConfigError, devtools.DevToolMissing) as e:
            print(f"delay-sidecar {args[0]}: error: {e}", file=sys.stderr)
            return 2
    parser = build_parser()
    ns = parser.parse_args(args)
    handlers = {"run": cmd_run, "dev-kafka": cmd_dev_kafka, "send": cmd_send, "cancel": cmd_cancel,
                "inspect": cmd_inspect, "demo": cmd_demo}
    try:
        return handlers[ns.command](ns)
    except (CliError, ConfigError, devtools.DevToolMissing) as e:
        print(f"delay-sidecar {ns.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
