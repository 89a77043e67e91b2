"""The dev broker in Docker: testcontainers' ``KafkaContainer`` in KRaft mode, where an engine answers.

:class:`devkafka.local.LocalKafka` picks this at its first start when ``prefer_docker`` holds, the
broker is not a secured one and :func:`docker_available`; otherwise it runs the Apache jars.
The container takes a fixed host port, so that a stop/start of the same container keeps its
advertised address (what clients reconnect to); its data lives in the container until it is
removed. Readiness is the same as for the jars: a client gets metadata naming a broker. Not
exercised on machines without an engine (this one has none).
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["DOCKER_IMAGE", "docker_available", "start_container", "wait_container"]

DOCKER_IMAGE = os.environ.get("KDS_KAFKA_IMAGE", "confluentinc/cp-kafka:7.6.0")
"""Image for the Docker path (testcontainers' default; its KRaft support needs >= 7.0)."""


def start_container(container: Any, port: int, settings: Mapping[str, str], timeout: float) -> Any:
    """Start a new container on host ``port`` with broker ``settings`` (``container=None``), or
    start a stopped one again (same volume, same port); return it, started but maybe not ready."""
    if container is None:
        community = importlib.import_module("testcontainers.community.kafka")
        container = community.KafkaContainer(image=DOCKER_IMAGE).with_kraft()
        # A fixed host port: the advertised listener (host:port) then survives stop/start.
        container.with_bind_ports(container.port, port)
        for key, value in settings.items():
            container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
        container.start(timeout=int(timeout))
    else:  # restart after stop(): same container, same volume, same port
        container.get_wrapped_container().start()
    return container


def wait_container(container: Any, deadline: float, admin_client: Callable[[str], Any]) -> tuple[str, str | None]:
    """The container's bootstrap and cluster id once a client (``admin_client(bootstrap)``) gets
    metadata naming a broker; ``TimeoutError`` when none did by ``deadline`` (monotonic)."""
    # What the container advertises (usually localhost:PORT); clients follow that anyway.
    bootstrap = str(container.get_bootstrap_server())
    admin = admin_client(bootstrap)
    last_error = "no brokers in metadata"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"Kafka container not ready on {bootstrap}: {last_error}")
        try:
            md = admin.list_topics(timeout=max(1.0, min(10.0, remaining)))
        except Exception as exc:
            last_error = str(exc)
        else:
            if md.brokers:
                return bootstrap, md.cluster_id
        time.sleep(0.5)


def docker_available(timeout: float = 3.0) -> bool:
    """True when a Docker engine answers a ping (the docker SDK comes with testcontainers)."""
    try:
        docker = importlib.import_module("docker")
        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False
