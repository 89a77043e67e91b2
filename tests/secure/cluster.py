"""Test-side handle on the secured broker: users, ACLs and clients, all through the Admin API.

Everything an administrator would do with ``kafka-acls`` / ``kafka-configs``, done as the super
user ``admin`` with confluent_kafka's AdminClient; each change is waited for until the broker
answers with it (a new user can log in, a granted ACL is listed), so a test never races the
metadata log.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterable, Iterator
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AclBindingFilter, AdminClient, NewTopic  # type: ignore[attr-defined]

from devkafka.local import LocalKafka
from devkafka.secure import acl_binding, add_user
from sidecar.acls import Acl


class SecureCluster:
    def __init__(self, kafka: LocalKafka, bootstrap: str) -> None:
        assert kafka.secure is not None
        self.kafka = kafka
        self.secure = kafka.secure
        self.bootstrap = bootstrap
        self.admin_conf: dict[str, str] = {"bootstrap.servers": bootstrap, **self.secure.client_config()}
        self.admin = AdminClient(self.admin_conf)

    def close(self) -> None:
        del self.admin

    @classmethod
    @contextlib.contextmanager
    def serving(cls, kafka: LocalKafka, bootstrap: str) -> Iterator[SecureCluster]:
        """The handle on ``kafka`` (started, at ``bootstrap``); the broker is closed after it."""
        cluster = cls(kafka, bootstrap)
        try:
            yield cluster
        finally:
            cluster.close()
            kafka.close()

    def new_user(self, prefix: str) -> dict[str, str]:
        """A new SCRAM-SHA-512 user ``<prefix>-<hex>`` with no ACL; returns its client properties
        (``bootstrap.servers`` included) once it can log in."""
        name = f"{prefix}-{secrets.token_hex(3)}"
        password = secrets.token_hex(12)
        add_user(self.admin, name, password)
        conf = {"bootstrap.servers": self.bootstrap, **self.secure.client_config(name, password)}
        probe = AdminClient(conf)
        deadline = time.monotonic() + 30
        while True:
            try:
                probe.list_topics(timeout=5)
                return conf
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    @staticmethod
    def principal(conf: dict[str, str]) -> str:
        return f"User:{conf['sasl.username']}"

    def grant(self, principal: str, acls: Iterable[Acl]) -> list[Any]:
        """Create ALLOW bindings for ``acls``; returns them (for :meth:`revoke`) once listed."""
        bindings = self.bindings(principal, acls)
        if bindings:
            for fut in self.admin.create_acls(bindings).values():
                fut.result()
            self._wait_listed(principal, bindings, present=True)
        return bindings

    @staticmethod
    def bindings(principal: str, acls: Iterable[Acl]) -> list[Any]:
        """The ALLOW bindings of ``acls`` for ``principal``."""
        return [acl_binding(principal, _resource(a), a.name, a.pattern.upper(), _operation(a)) for a in acls]

    def revoke_acls(self, principal: str, acls: Iterable[Acl]) -> None:
        """Delete the bindings of ``acls`` (:meth:`grant` gave them) once they are gone."""
        self.revoke(principal, self.bindings(principal, acls))

    def revoke(self, principal: str, bindings: list[Any]) -> None:
        filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                    b.permission_type) for b in bindings]
        for fut in self.admin.delete_acls(filters).values():
            fut.result()
        self._wait_listed(principal, bindings, present=False)

    def _wait_listed(self, principal: str, bindings: list[Any], present: bool) -> None:
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None,
                                      AclOperation.ANY, AclPermissionType.ANY)
        want = {_key(b) for b in bindings}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listed = {_key(b) for b in self.admin.describe_acls(everything).result()}
            if (want <= listed) if present else not (want & listed):
                return
            time.sleep(0.1)
        raise AssertionError(f"ACLs of {principal} not {'listed' if present else 'gone'} within 30 s")

    def create_topics(self, topics: Iterable[str], partitions: int = 1, compact: Iterable[str] = ()) -> None:
        compacted = set(compact)
        new = [NewTopic(t, num_partitions=partitions, replication_factor=1,
                        config={"cleanup.policy": "compact"} if t in compacted else {}) for t in topics]
        for fut in self.admin.create_topics(new).values():
            fut.result(30)


def _resource(a: Acl) -> str:
    return {"topic": "TOPIC", "group": "GROUP", "transactional-id": "TRANSACTIONAL_ID", "cluster": "BROKER"}[a.resource]


def _operation(a: Acl) -> str:
    return {"Read": "READ", "Write": "WRITE", "Describe": "DESCRIBE", "DescribeConfigs": "DESCRIBE_CONFIGS",
            "Create": "CREATE", "IdempotentWrite": "IDEMPOTENT_WRITE"}[a.operation]


def _key(b: Any) -> tuple[Any, ...]:
    return (b.restype, b.name, b.resource_pattern_type, b.operation, b.permission_type)
