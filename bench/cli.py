"""``delay-sidecar bench SCENARIO [--size small|full] --json OUT [--bootstrap-servers B]``.

SCENARIO is one of ``throughput``, ``lateness``, ``pending-memory``, ``lookup``, ``list``, ``restart``,
``mass-expiry``, ``redis-zset``, ``pg-poll``, ``rabbit-ttl``, ``streams-punctuator``, ``append``, ``steady``,
``failover``, ``restore``, ``redrive``, ``tenants``, ``recurring``, ``exactly-once``, ``scale``, ``all``, or a
comma-separated list of them (``all`` is every one but ``scale``, which takes ``--scale-pending N`` and
``--scale-rate R`` and runs only when named). Without ``--bootstrap-servers`` the bench starts its own local broker
(:class:`devkafka.local.LocalKafka`) in the work directory and stops it at the end, unless every scenario asked for
runs in-process without one (``append``, ``steady``). The schedulers measured are every one that runs: ``levels``
always, ``wheel`` once ``python -m sidecar run --scheduler wheel`` starts (detected by trying), or the ones given
with ``--schedulers``; in-process scenarios alone measure both unless told otherwise. ``throughput`` and
``lateness`` measure every changelog mode given with ``--changelog`` (default ``on,off``: the sidecar's default, and
``--changelog off``) and every delivery mode given with ``--delivery`` (default ``at-least-once,exactly-once``: the
changelog modes, then ``--delivery exactly-once`` with the changelog on), with the record shapes given with
``--shape`` (``plain``, ``common``: see :mod:`bench.shape`; default both at full size, ``plain`` at small size); the
other scenarios run the sidecar's default (changelog on, at least once), except with ``--changelog off`` alone, when
every scenario that can runs with it off (``failover`` and ``restore`` need it).

The JSON report holds the machine facts, the settings, and per scenario its method, settings,
``results`` (every figure as ``{"value", "unit", "goal", "met"}``) and raw ``details``. It is
rewritten after every scenario, so an interrupted run still leaves what was measured. A Markdown
table of all figures is printed to stdout at the end; ``--baseline FILE`` then prints each
figure's change against a committed baseline and ``--update-baseline FILE`` writes this run's
figures as one (:mod:`bench.compare`; CI prints the small comparison). Exit status: 0 when every scenario
produced its report (goals met or not), 1 when a scenario failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import functools
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import orjson

import sidecar
from bench import (
    append,
    compare,
    exactly_once,
    failover,
    lateness,
    listing,
    lookup,
    mass_expiry,
    options,
    pending_memory,
    pg_poll,
    rabbit_ttl,
    recurring,
    redis_zset,
    redrive,
    restart,
    restore,
    scale,
    shape,
    steady,
    streams_punctuator,
    tenants,
    throughput,
)
from bench.report import machine_facts, markdown_pivot, walk_figures
from bench.workload import (
    PASSTHROUGH_ENV,
    SIDECAR_PYTHON_ENV,
    SIZES,
    TRANSACTION_INTERVAL_MS,
    Bench,
    BenchError,
    SidecarProc,
    delete_topics,
    disk_low,
    kafka_ready,
    log,
    stop_all,
    uid,
    unwatch_all,
    watch,
)
from sidecar.durations import format_duration_ms

if TYPE_CHECKING:
    from devkafka.local import LocalKafka

SCENARIOS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "throughput": throughput.run,
    "lateness": lateness.run,
    "pending-memory": pending_memory.run,
    "lookup": lookup.run,
    "list": listing.run,
    "restart": restart.run,
    "mass-expiry": mass_expiry.run,
    "redis-zset": redis_zset.run,
    "pg-poll": pg_poll.run,
    "rabbit-ttl": rabbit_ttl.run,
    "streams-punctuator": streams_punctuator.run,
    "append": append.run,
    "steady": steady.run,
    "failover": failover.run,
    "restore": restore.run,
    "redrive": redrive.run,
    "scale": scale.run,
    "exactly-once": exactly_once.run,
    "recurring": recurring.run,
    "tenants": tenants.run,
}
WARMUP_S = 45.0  # traffic through a broker started by the bench, before the first scenario (full size)

# In-process scenarios: they measure the store (append, list) or the loop (steady) alone and need neither a
# broker nor a sidecar process.
NO_BROKER = frozenset({"append", "steady", "list"})
SCHEDULERS = ("levels", "wheel")
CHANGELOG_MODES = ("on", "off")
DELIVERY_MODES = ("at-least-once", "exactly-once")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="delay-sidecar bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", metavar="SCENARIO",
                    help=f"{', '.join(SCENARIOS)}, all, or a comma-separated list")
    ap.add_argument("--size", choices=SIZES, default="small", help="small (CI smoke, minutes) or full")
    ap.add_argument("--json", required=True, metavar="OUT", help="where to write the JSON report")
    ap.add_argument("--bootstrap-servers", default=None, help="an existing broker (default: start a local one)")
    ap.add_argument("--schedulers", default=None,
                    help="comma-separated schedulers to measure (default: levels, plus wheel if it starts)")
    ap.add_argument("--changelog", default="on,off", metavar="MODES",
                    help="comma-separated changelog modes throughput and lateness measure: on (the default "
                         "flags), off (--changelog off); default: on,off. off alone: every scenario "
                         "but failover and restore runs with the changelog off")
    ap.add_argument("--delivery", default=",".join(DELIVERY_MODES), metavar="MODES",
                    help="comma-separated delivery modes throughput and lateness measure: at-least-once (in "
                         "each --changelog mode), exactly-once (--delivery exactly-once, changelog on); "
                         "default: at-least-once,exactly-once. exactly-once alone: recurring runs with it too")
    options.add_arguments(ap, [options.SHAPE])
    ap.add_argument("--transaction-interval", type=options.interval, default=None, metavar="DURATION",
                    help="the exactly-once sidecars' --transaction-interval (default: the sidecar's, "
                         f"{format_duration_ms(TRANSACTION_INTERVAL_MS)}), e.g. 50ms, 500ms, 1s")
    ap.add_argument("--workdir", default=None, help="data directories and logs (default: a temp dir, removed)")
    ap.add_argument("--broker-gc", choices=("g1", "zgc"), default="g1",
                    help="the collector of the broker the bench starts: g1 (Kafka's own scripts') or zgc "
                         "(pauses under 1 ms; the scale scenario's, docs/benchmarks.md)")
    ap.add_argument("--keep-workdir", action="store_true", help="keep the work directory (logs, stores)")
    ap.add_argument("--baseline", metavar="FILE", default=None,
                    help="print each figure's change against this baseline (bench/baseline-small.json); "
                         "never changes the exit status")
    ap.add_argument("--update-baseline", metavar="FILE", default=None,
                    help="write this run's figures as the baseline FILE (commit it)")
    ap.add_argument("--profile", metavar="DIR", default=None,
                    help="run every sidecar under cProfile and write .prof files to DIR (slows it down)")
    options.add_arguments(ap, options.TUNING)
    ns = ap.parse_args(argv)
    _check_lists(ap, ns)
    options.check_after_parsing(ap, ns)
    return ns


def _check_lists(ap: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """The scenario list and the comma-separated mode flags, as lists in ``ns`` (``names``,
    ``schedulers``, ``changelog_modes``, ``delivery_modes``); a bad one exits 2 through ``ap.error``."""
    names = [s.strip() for s in ns.scenario.split(",") if s.strip()]
    if names == ["all"]:
        names = [n for n in SCENARIOS if n != "scale"]  # hours at full size: asked for by name only
    bad = [s for s in names if s not in SCENARIOS]
    if bad or not names:
        ap.error(f"unknown scenario {', '.join(bad) or ns.scenario!r}; choose from {', '.join(SCENARIOS)}, all")
    ns.names = names
    if ns.schedulers is not None:
        ns.schedulers = [s.strip() for s in ns.schedulers.split(",") if s.strip()]
        if not ns.schedulers or any(s not in SCHEDULERS for s in ns.schedulers):
            ap.error(f"--schedulers: choose from {', '.join(SCHEDULERS)}")
    modes = [m.strip() for m in ns.changelog.split(",") if m.strip()]
    if not modes or any(m not in CHANGELOG_MODES for m in modes) or len(set(modes)) != len(modes):
        ap.error(f"--changelog {ns.changelog!r}: give on, off or on,off")
    ns.changelog_modes = modes
    delivery = [m.strip() for m in ns.delivery.split(",") if m.strip()]
    if not delivery or any(m not in DELIVERY_MODES for m in delivery) or len(set(delivery)) != len(delivery):
        ap.error(f"--delivery {ns.delivery!r}: give at-least-once, exactly-once or both, comma-separated")
    ns.delivery_modes = delivery


def scheduler_runs(bootstrap: str, workdir: Path, scheduler: str, timeout_s: float = 90) -> tuple[bool, str]:
    """Try ``python -m sidecar run --scheduler X`` on a scratch topic: does it get its partition?"""
    sc = SidecarProc(bootstrap, workdir, f"bench.probe.{uid()}", scheduler, tag="probe")
    try:
        sc.start(wait=True, timeout_s=timeout_s)
        return True, "started"
    except BenchError as e:
        return False, str(e).splitlines()[-1][:300] if str(e) else "did not start"
    finally:
        sc.stop()
        delete_topics(bootstrap, [sc.ingress, sc.dlq, f"{sc.ingress}.changelog"])


def _write(path: Path, report: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    tmp.replace(path)


def _on_term(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def broker_exit(broker: LocalKafka) -> str | None:
    """Why the bench's own broker is gone, if it ended by itself (a scenario that restarts it goes
    through the object, which this does not count): its status and the last lines of its log."""
    code = broker.exited
    if code is None:
        return None
    return f"the bench's broker exited with status {code} (log {broker.log_path}):\n{broker.log_tail(5)}"


def byte_compile() -> None:
    """The sidecar's modules byte-compiled before any sidecar starts, as an installed wheel's are
    (pip compiles them at install, the image too): a start from the sources alone compiles every
    module again where ``PYTHONDONTWRITEBYTECODE`` is set (this VM): 137 modules, 0.18 s of each
    start, which a restart's figure would count."""
    compileall.compile_dir(str(Path(sidecar.__file__).parent), quiet=1)


def bench_main(argv: list[str]) -> int:
    ns = parse_args(argv)
    byte_compile()
    out = Path(ns.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    own_workdir = ns.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="delay-sidecar-bench-")) if own_workdir else Path(ns.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    low = disk_low(workdir)
    if low is not None:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"delay-sidecar bench: {low}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _on_term)
    broker: LocalKafka | None = None
    bench: Bench | None = None
    report: dict[str, Any] = {
        "schema": 1,
        "command": "delay-sidecar bench " + " ".join(argv),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "size": ns.size,
        "scenarios": {},
    }
    failed = False
    try:
        watch(functools.partial(disk_low, workdir))
        bootstrap = ns.bootstrap_servers
        needs_broker = any(name not in NO_BROKER for name in ns.names)
        if bootstrap is None and needs_broker:
            from devkafka.local import LocalKafka

            # its GC pauses logged: the scale scenario reports them beside the lateness
            broker = LocalKafka(port=0, data_dir=workdir / "kafka", prefer_docker=False, gc_log=True,
                                gc=ns.broker_gc)
            log("starting a local Kafka broker ...")
            bootstrap = broker.start(timeout=240)
            log(f"broker: {broker.describe()}")
            watch(functools.partial(broker_exit, broker))
        if needs_broker:
            kafka_ready(bootstrap)
        bench = _bench(ns, report, bootstrap, workdir, broker, needs_broker)
        _write(out, report)
        failed = _run_scenarios(ns, bench, report, out)
    finally:
        unwatch_all()
        stop_all()
        if bench is not None:
            bench.close()
        if broker is not None:
            broker.close()
        signal.signal(signal.SIGTERM, previous)
        report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        report["summary"] = _summary(report)
        _write(out, report)
        if own_workdir and not ns.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(markdown_pivot(report))
    log(f"report written to {out}")
    if ns.baseline is not None:
        print(compare.print_comparison(Path(ns.baseline), report))
    if ns.update_baseline is not None and not failed:
        compare.write_baseline(Path(ns.update_baseline), report)
        log(f"baseline written to {ns.update_baseline}")
    return 1 if failed else 0


def _bench(ns: argparse.Namespace, report: dict[str, Any], bootstrap: str | None, workdir: Path,
           broker: LocalKafka | None, needs_broker: bool) -> Bench:
    """The scenarios' ``Bench``, once the broker (if one is needed) answers; the report gets the
    machine facts and the settings, the broker's warm-up among them at full size."""
    report["machine"] = machine_facts(broker.kafka_version if broker else None)
    report["machine"]["loadavg_1_5_15_at_start"] = [round(x, 2) for x in os.getloadavg()]
    settings: dict[str, Any] = {"bootstrap": "local (started by the bench)" if broker else
                                "external" if bootstrap and needs_broker else "none (no scenario needs a broker)",
                                "workdir": str(workdir)}
    report["settings"] = settings
    if broker:
        settings["broker_gc"] = ns.broker_gc
    schedulers = _schedulers(ns, bootstrap, workdir, needs_broker, settings)
    settings["schedulers"] = schedulers
    settings["changelog_modes"] = ns.changelog_modes
    settings["delivery_modes"] = ns.delivery_modes
    settings["transaction_interval_ms"] = ns.transaction_interval or TRANSACTION_INTERVAL_MS
    # what ran in place of the harness's own passthrough or sidecar Python, if anything
    settings.update({k: v for k, v in (("passthrough_cmd", os.environ.get(PASSTHROUGH_ENV)),
                                        ("sidecar_python", os.environ.get(SIDECAR_PYTHON_ENV))) if v})
    bench = Bench(bootstrap or "", workdir, ns.size, schedulers,
                  profile_dir=Path(ns.profile).resolve() if ns.profile else None,
                  changelog_modes=ns.changelog_modes, delivery_modes=ns.delivery_modes,
                  options=options.bench_options(ns), broker=broker,
                  transaction_interval_ms=ns.transaction_interval or TRANSACTION_INTERVAL_MS)
    settings["shapes"] = shape.shapes_for(bench)
    if broker is not None and ns.size == "full":
        # a broker started here is a fresh JVM: warm its JIT up before measuring anything
        log(f"warming the broker up ({WARMUP_S:.0f} s of traffic) ...")
        settings["broker_warmup"] = bench.warm_up(WARMUP_S)
    return bench


def _schedulers(ns: argparse.Namespace, bootstrap: str | None, workdir: Path, needs_broker: bool,
                settings: dict[str, Any]) -> list[str]:
    """``--schedulers``, or both in-process (nothing to detect), or levels plus wheel if it starts on
    the broker (``settings`` gets what the detection found)."""
    if ns.schedulers is not None:
        return list(ns.schedulers)
    if not needs_broker:
        return list(SCHEDULERS)  # in-process: nothing to detect
    schedulers = ["levels"]
    ok, why = scheduler_runs(bootstrap or "", workdir, "wheel")
    if ok:
        schedulers.append("wheel")
    else:
        log(f"scheduler wheel does not run yet, measuring levels only ({why})")
    settings["wheel_detected"] = ok
    if not ok:
        settings["wheel_detection"] = why
    return schedulers


def _run_scenarios(ns: argparse.Namespace, bench: Bench, report: dict[str, Any], out: Path) -> bool:
    """Run every scenario asked for, each one's result into the report as it ends (a failed one's
    error, then on with the next); True when one failed."""
    failed = False
    for name in ns.names:
        log(f"scenario {name} ({ns.size}) ...")
        t0 = time.monotonic()
        try:
            res = SCENARIOS[name](bench)
        except Exception as e:  # report it and go on with the next scenario
            failed = True
            log(f"scenario {name} failed: {e}")
            res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
            stop_all()
            with contextlib.suppress(Exception):
                bench.cleanup_topics()
        res["seconds"] = round(time.monotonic() - t0, 1)
        res["loadavg_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
        report["scenarios"][name] = res
        _write(out, report)
        log(f"scenario {name} done in {res['seconds']} s")
    return failed


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    """The report's count of figures: with a goal, met, not met (their paths), and failed scenarios."""
    figures = [(f"{n}.{p}", f) for n, s in report["scenarios"].items() for p, f in walk_figures(s.get("results"))]
    return {
        "figures": len(figures),
        "with_goal": sum(1 for _p, f in figures if f["goal"] is not None),
        "met": sum(1 for _p, f in figures if f["met"] is True),
        "not_met": [p for p, f in figures if f["met"] is False],
        "failed_scenarios": [n for n, s in report["scenarios"].items() if "error" in s],
    }


if __name__ == "__main__":
    sys.exit(bench_main(sys.argv[1:]))
