"""The Apache Kafka broker jars, fetched once with Maven into a cache outside the repository.

Why jars and not a Kafka tarball or Docker: the design (docs/design.md 6) wants `delay-sidecar run`,
`delay-sidecar dev-kafka` and the test suite to get a *real* broker on a machine that only has Java,
Maven and access to package registries. Maven Central is such a registry and already hosts every
jar of the broker (``org.apache.kafka:kafka_2.13``), so ``mvn dependency:copy-dependencies`` on a
tiny POM (``scripts/kafka-pom.xml``) yields a complete classpath that ``java -cp 'DIR/*'
kafka.Kafka server.properties`` runs. No download scripts, no checksums to maintain by hand: Maven
verifies what it fetches and keeps its own ``~/.m2`` cache.

Layout: ``$KDS_CACHE/kafka-<version>/`` (``KDS_CACHE`` defaults to
``~/.cache/kafka-delay-sidecar``) holds the jars plus a marker file, ``.complete``, written only
after a download finished and a smoke test (``kafka.tools.StorageTool random-uuid``) ran from that
very classpath. The marker makes the common case (already cached) a stat call; a half-finished
download (killed CI job, no network) never counts as cached. Concurrent callers (parallel test
sessions, CI steps) are serialised with an ``flock`` on a lock file beside the directory.

Version: 4.1.1 first; if Maven cannot resolve it, the next 4.x releases in ``FALLBACK_VERSIONS``.
``KDS_KAFKA_VERSION`` pins one version (no fallback).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "FALLBACK_VERSIONS",
    "KAFKA_VERSION",
    "KafkaJarsError",
    "cache_root",
    "ensure_kafka_jars",
    "java_executable",
    "kafka_version",
]

KAFKA_VERSION = "4.1.1"
"""The broker version we want; the Python client (librdkafka) is version-agnostic."""

FALLBACK_VERSIONS: tuple[str, ...] = ("4.1.0", "4.0.1", "4.0.0")
"""Tried in order when ``KAFKA_VERSION`` cannot be fetched (e.g. a mirror that lags behind)."""

MARKER = ".complete"
_MVN_TIMEOUT_S = 900.0
_SMOKE_TIMEOUT_S = 120.0

_TargetFor = Callable[[str], Path]


class KafkaJarsError(RuntimeError):
    """The broker jars could not be fetched or do not form a working classpath."""


def cache_root() -> Path:
    """``$KDS_CACHE`` or ``~/.cache/kafka-delay-sidecar``: every download of the project lives here."""
    env = os.environ.get("KDS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kafka-delay-sidecar"


def java_executable() -> str:
    """The ``java`` to run the broker with: ``$JAVA_HOME/bin/java`` if present, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise KafkaJarsError("java not found (set JAVA_HOME or put Java 17+ on PATH)")
    return found


def kafka_version(jars_dir: Path) -> str:
    """The Kafka version of a directory returned by :func:`ensure_kafka_jars`."""
    marker = jars_dir / MARKER
    try:
        for line in marker.read_text(encoding="utf-8").splitlines():
            if line.startswith("version="):
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    for jar in jars_dir.glob("kafka_2.13-*.jar"):
        return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")
    raise KafkaJarsError(f"{jars_dir} holds no Kafka broker jars")


def ensure_kafka_jars(cache_dir: Path | None = None) -> Path:
    """Return a directory holding every jar the Kafka broker needs, downloading them once.

    ``cache_dir`` given: the jars go exactly there (whichever version could be fetched).
    ``cache_dir`` omitted: ``$KDS_CACHE/kafka-<version>/``; an already complete directory of the
    preferred version (or, failing that, of a fallback version) is returned without running Maven.
    Raises :class:`KafkaJarsError` with Maven's output when no version could be fetched.
    """
    versions = _candidate_versions()
    if cache_dir is not None:
        target = Path(cache_dir).expanduser().resolve()
        if _is_complete(target):
            return target
        return _download_first(versions, lambda _v: target)

    root = cache_root()
    for version in versions:
        candidate = root / f"kafka-{version}"
        if _is_complete(candidate):
            return candidate
    return _download_first(versions, lambda v: root / f"kafka-{v}")


def _candidate_versions() -> list[str]:
    pinned = os.environ.get("KDS_KAFKA_VERSION", "").strip()
    if pinned:
        return [pinned]
    return [KAFKA_VERSION, *FALLBACK_VERSIONS]


def _is_complete(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def _download_first(versions: list[str], target_for: _TargetFor) -> Path:
    errors: list[str] = []
    for version in versions:
        target = target_for(version)
        try:
            return _download(version, target)
        except KafkaJarsError as exc:
            errors.append(f"--- Kafka {version}: {exc}")
    raise KafkaJarsError("could not fetch the Kafka broker jars with Maven:\n" + "\n".join(errors))


def _pom_path() -> Path:
    """The POM kept in the repository (``scripts/kafka-pom.xml``); ``KDS_KAFKA_POM`` overrides it."""
    env = os.environ.get("KDS_KAFKA_POM")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[1] / "scripts" / "kafka-pom.xml"  # devkafka/jars.py -> the checkout


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _download(version: str, target: Path) -> Path:
    pom = _pom_path()
    if not pom.is_file():
        raise KafkaJarsError(f"Maven POM not found at {pom} (set KDS_KAFKA_POM)")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaJarsError("mvn not found on PATH (Maven is needed once to fetch the Kafka jars)")

    with _locked(target.parent / f".{target.name}.lock"):
        if _is_complete(target):  # another process finished while we waited for the lock
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            with tempfile.TemporaryDirectory(prefix="kds-kafka-pom-") as workdir:
                # mvn writes target/ next to the POM: run it on a copy so the repo stays untouched.
                work_pom = Path(workdir) / "pom.xml"
                shutil.copyfile(pom, work_pom)
                cmd = [
                    mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(work_pom),
                    "dependency:copy-dependencies",
                    f"-Dkafka.version={version}",
                    f"-DoutputDirectory={staging}",
                ]  # fmt: skip
                started = time.monotonic()
                try:
                    proc = subprocess.run(
                        cmd, cwd=workdir, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, check=False
                    )
                except subprocess.TimeoutExpired as exc:
                    raise KafkaJarsError(f"mvn timed out after {_MVN_TIMEOUT_S:.0f}s") from exc
                if proc.returncode != 0:
                    tail = (proc.stdout + proc.stderr).strip().splitlines()[-25:]
                    raise KafkaJarsError(f"mvn exited with {proc.returncode}:\n" + "\n".join(tail))
                elapsed = time.monotonic() - started
            _check_classpath(staging, version)
            (staging / MARKER).write_text(
                f"version={version}\nfetched_in_s={elapsed:.1f}\njars={len(list(staging.glob('*.jar')))}\n",
                encoding="utf-8",
            )
            if target.exists():  # an incomplete earlier attempt
                shutil.rmtree(target)
            staging.chmod(0o755)  # mkdtemp made it private; the cache is shared like ~/.m2
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _check_classpath(directory: Path, version: str) -> None:
    """The jars that must be there, then one real JVM run from exactly this classpath."""
    required = [
        f"kafka_2.13-{version}.jar",
        f"kafka-clients-{version}.jar",
        f"kafka-server-{version}.jar",
        f"kafka-raft-{version}.jar",
    ]
    missing = [name for name in required if not (directory / name).is_file()]
    for prefix in ("log4j-core-", "log4j-slf4j-impl-", "slf4j-api-", "scala-library-"):
        if not any(directory.glob(f"{prefix}*.jar")):
            missing.append(f"{prefix}*.jar")
    if missing:
        raise KafkaJarsError(f"incomplete classpath in {directory}: missing {', '.join(missing)}")
    cmd = [java_executable(), "-Xmx128m", "-cp", f"{directory}/*", "kafka.tools.StorageTool", "random-uuid"]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=_SMOKE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaJarsError("smoke test (StorageTool random-uuid) timed out") from exc
    if proc.returncode != 0 or not proc.stdout.strip():
        raise KafkaJarsError(
            f"smoke test failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-2000:]}"
        )


if __name__ == "__main__":  # pragma: no cover - convenience: python -m devkafka.jars
    print(ensure_kafka_jars())
