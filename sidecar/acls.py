"""The Kafka ACLs each command needs, from the settings: least privilege, generated.

Pure: :class:`~sidecar.config.Settings` (and the target topics) in, a list of :class:`Acl` out;
:func:`render` prints them as ``kafka-acls.sh`` commands or a Strimzi ``KafkaUser``.
``delay-sidecar acls`` and the docs' table (docs/operations.md, "Security and ACLs") come
from here; the integration tests grant exactly this list on a secured broker (tests/secure/).

What each command does to Kafka, and the ACL that allows it (the broker's rules: Read, Write
and DescribeConfigs imply Describe, so Describe is listed only where nothing implies it):

``run`` (the sidecar, engine/kafka_io.py):
  * ingress topic: consumed by the group (Read), its partition count asked (Describe: implied);
  * group ``group-id``: joined, offsets committed, described for standbys and the status
    address (Read); in exactly-once the offsets go in the transaction (TxnOffsetCommit: Read);
  * DLQ topic: dead letters produced (Write);
  * the targets: deliveries produced (Write); a target the principal may not even Describe looks
    missing (``delivery-grace``, then the DLQ);
  * changelog topic (``changelog: on``, standbys too): store changes produced (Write), restored
    and tailed by a consumer assigned by hand (Read), its ``cleanup.policy`` checked
    (DescribeConfigs); that consumer never joins its group ``<group-id>.restore``, but librdkafka
    looks the group's coordinator up all the same (Describe on that group);
  * history topic: state changes produced (Write);
  * exactly-once: the transactional id ``<group-id>.<group-instance-id>`` (Write on the
    transactional ids prefixed ``<group-id>.``, one per instance); the idempotent producer needs
    no IdempotentWrite on the cluster since Kafka 2.8 (Write on a topic is enough, KIP-679);
  * topic auto-creation (``--create-topics``): the sidecar creates the ingress, DLQ, changelog and
    history topics that are missing (Create on each, literal). Without it an admin creates them
    beforehand (docs/operations.md).
  * a tenant with ``kafka:`` overrides (``tenants.<name>.kafka``: its own principal) publishes its
    deliveries and dead letters as itself: the sidecar's principal then needs only Describe on
    that tenant's DLQ (the start-up check finds it), and Write on the targets only while some
    tenant publishes as the sidecar; in exactly-once the tenant also writes its changelog (in its
    own transactions): the sidecar keeps only Read and DescribeConfigs on it.
``tenant`` (``--tenant NAME``, or every tenant): the principal of a tenant's ``kafka:``
  overrides (engine/tenant_producers.py): Write on its DLQ (its dead letters) and on its targets
  (its deliveries; ``--target``/``--target-prefix``, else the tenant's own ``target-allowlist``,
  else the top-level one). Then what the tenant's own commands do when they run as it
  (sidecar/tenant_option.py: their producer takes the tenant's ``kafka:``; their readers too
  when the tenant's credentials are given in ``--kafka``): ``cancel --tenant`` writes its
  ingress topic (Write; ``dlq redrive --to ingress`` too); ``dlq list``/``dlq redrive
  --tenant`` are ``dlq-redrive`` on the tenant's DLQ, with both destinations. The ingress
  topic's group and history stay the sidecar's. In ``delivery: exactly-once`` the tenant runs its
  own transactions (engine/txn_lanes.py): Write on its transactional ids (prefixed
  ``<group-id>.<tenant>:``, one per instance), Write on its changelog topic (its partitions' store
  changes), and Read on the group and on its ingress topic (its partitions' ingress offsets go
  in its transactions: the broker's TxnOffsetCommit asks Read on both). No IdempotentWrite: a
  transactional producer's id is allowed by the Write on its transactional id.
``status``: describes the group and reads its committed offsets (Describe on the group, Describe
  on the ingress topic).
``dlq-list``: reads the DLQ and the redrive marker topic ``<dlq-topic>.redrive`` (Read), from an
  assigned consumer (no group is joined and nothing is committed; its random group
  ``delay-sidecar-dlq-*`` is looked up all the same: Describe on that prefix).
``dlq-redrive``: as ``dlq-list``, plus the marker topic written (Write) in transactions with the
  id ``delay-sidecar-redrive.<dlq-topic>`` (Write), and the re-sent records: Write on the targets
  (``--to target``) or on the ingress topic (``--to ingress``); Create on the marker topic with
  ``--create-topics``.
``producer``: an application that sends delayed records: Write on the ingress topic, nothing else.
``accuracy`` (the Spark job, spark/accuracy.py): reads the ingress topic (or, with
  ``--history-topic``, the history topic instead) and the targets (Read; their offsets are looked
  up by Spark's admin client: Describe, implied). Its consumers are assigned partitions and commit
  nothing: no group ACL.

Targets: the sidecar's principal needs Write on every topic it delivers to, and on nothing else
(the trust model: docs/operations.md, "Security and ACLs"). They come from ``--target`` /
``--target-prefix``, or from ``target-allowlist`` when its entries are literal topic names or
``PREFIX.*``; any other regular expression cannot be an ACL and must be given as targets.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from sidecar.config import Settings, load_settings
from sidecar.contract import restore_group
from sidecar.dlq import DESTINATIONS, DLQ_GROUP_PREFIX, MARKER_SUFFIX, TRANSACTIONAL_PREFIX
from sidecar.engine.transactions import tenant_transactional_id
from sidecar.tenants import Tenant

COMMANDS = ("run", "tenant", "status", "dlq-list", "dlq-redrive", "producer", "accuracy")
FORMATS = ("kafka-acls", "strimzi", "table")
TOPIC, GROUP, TXN, CLUSTER = "topic", "group", "transactional-id", "cluster"
LITERAL, PREFIXED = "literal", "prefixed"
PRINCIPAL_DEFAULT = "User:delay-sidecar"
_PLAIN = re.compile(r"(?:[A-Za-z0-9_-]|\\\.)+")  # a topic name as a regex: letters, digits, _, -, \.


class AclInputError(ValueError):
    """The targets cannot be told from the settings (a regex that is no topic name or prefix)."""


@dataclass(frozen=True, slots=True)
class Acl:
    """One ALLOW binding: ``operation`` on the ``resource`` called ``name`` (``pattern``)."""

    resource: str  # topic, group, transactional-id, cluster
    name: str
    pattern: str  # literal or prefixed
    operation: str  # Kafka's names: Read, Write, Describe, DescribeConfigs, Create
    why: str = ""
    when: str = "always"  # the setting that needs it (the docs' table)


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    pattern: str = LITERAL


def targets_from_allowlist(allowlist: Iterable[str]) -> list[Target]:
    """``orders\\.paid`` -> literal ``orders.paid``; ``orders\\..*`` -> prefix ``orders.``."""
    out = []
    for rx in allowlist:
        body, prefixed = (rx[:-2], True) if rx.endswith(".*") else (rx, False)
        if not _PLAIN.fullmatch(body):
            raise AclInputError(f"target-allowlist entry {rx!r} is neither a topic name nor PREFIX.* (e.g. "
                                r"'orders\..*'): give the targets as --target TOPIC or --target-prefix PREFIX")
        out.append(Target(body.replace("\\.", "."), PREFIXED if prefixed else LITERAL))
    return out


def acls_for(command: str, s: Settings, targets: Iterable[Target] = (), *, create_topics: bool = False,
             redrive_to: str = "target") -> list[Acl]:
    """The bindings ``command`` needs under ``s`` (see the module docstring), without duplicates."""
    targets = list(targets)
    out: list[Acl] = []

    def add(resource: str, name: str, op: str, why: str, pattern: str = LITERAL, when: str = "always") -> None:
        acl = Acl(resource, name, pattern, op, why, when)
        if all((a.resource, a.name, a.pattern, a.operation) != (resource, name, pattern, op) for a in out):
            out.append(acl)

    def write_targets() -> None:
        for t in targets:
            add(TOPIC, t.name, "Write", "deliveries", t.pattern, "each target")

    if command == "run":
        tenants = s.tenants  # every tenant's topics (sidecar/tenants.py): one group reads them all
        for ten in tenants:
            add(TOPIC, ten.ingress_topic, "Read", "consume the ingress topic")
        add(GROUP, s.group_id, "Read", "join the group, commit offsets, describe it")
        for ten in tenants:
            if ten.kafka:
                add(TOPIC, ten.dlq_topic, "Describe", "a tenant's DLQ (its own principal writes it)",
                    when="tenant kafka: set")
            else:
                add(TOPIC, ten.dlq_topic, "Write", "dead letters")
        if not all(ten.kafka for ten in tenants):  # some tenant publishes as the sidecar
            write_targets()
        on = "changelog: on"
        for ten in tenants:
            if ten.changelog_topic is not None:
                if not (s.exactly_once and ten.kafka):  # else the tenant writes it, in its transactions
                    add(TOPIC, ten.changelog_topic, "Write", "mirror store changes", when=on)
                add(TOPIC, ten.changelog_topic, "Read", "restore and standbys", when=on)
                add(TOPIC, ten.changelog_topic, "DescribeConfigs", "check cleanup.policy=compact", when=on)
        if s.changelog == "on":
            add(GROUP, restore_group(s.group_id), "Describe", "the changelog reader's group (never joined)", when=on)
        if s.history_topic is not None:
            add(TOPIC, s.history_topic, "Write", "history records", when="history-topic set")
        if s.exactly_once:
            add(TXN, f"{s.group_id}.", "Write", "one transactional id per instance", PREFIXED, "exactly-once")
        if create_topics:
            for topic in (*(x for ten in tenants for x in (ten.ingress_topic, ten.dlq_topic, ten.changelog_topic)),
                          s.history_topic):
                if topic is not None:
                    add(TOPIC, topic, "Create", "create it when missing", when="--create-topics")
    elif command == "tenant":
        raise AclInputError("--for tenant: the ACLs of each tenant's principal come from tenant_acls")
    elif command == "status":
        add(GROUP, s.group_id, "Describe", "find the partition's owner")
        add(TOPIC, s.ingress_topic, "Describe", "partition count, committed offsets")
    elif command in ("dlq-list", "dlq-redrive"):
        out.extend(dlq_acls(s.dlq_topic, s.ingress_topic, targets, redrive=command == "dlq-redrive",
                            to=(redrive_to,), create_topics=create_topics))
    elif command == "producer":
        add(TOPIC, s.ingress_topic, "Write", "send delayed records")
    elif command == "accuracy":
        add(TOPIC, s.ingress_topic, "Read", "what was sent")
        if s.history_topic is not None:
            add(TOPIC, s.history_topic, "Read", "what was accepted, instead of ingress", when="--history-topic")
        for t in targets:
            add(TOPIC, t.name, "Read", "what was delivered", t.pattern, "each target")
    else:
        raise AclInputError(f"unknown command {command!r}: one of {', '.join(COMMANDS)}")
    return out


def tenant_acls(s: Settings, tenant: Tenant, targets: Iterable[Target] = (), *, create_topics: bool = False
                ) -> list[Acl]:
    """The bindings the principal of ``tenant``'s ``kafka:`` overrides needs (module docstring);
    ``targets``: its targets, else those of its ``target-allowlist``."""
    targets = list(targets) or targets_from_allowlist(tenant.target_allowlist)
    out = [Acl(TOPIC, tenant.dlq_topic, LITERAL, "Write", "its dead letters")]
    out += [Acl(TOPIC, t.name, t.pattern, "Write", "its deliveries (and dlq redrive --to target)", "each target")
            for t in targets]
    if s.exactly_once:
        eos = "exactly-once"
        out.append(Acl(TXN, tenant_transactional_id(s.group_id, tenant.name, ""), PREFIXED, "Write",
                       "its transactions, one transactional id per instance", eos))
        if tenant.changelog_topic is not None:
            out.append(Acl(TOPIC, tenant.changelog_topic, LITERAL, "Write", "its store changes, in its transactions",
                           eos))
        out += [Acl(GROUP, s.group_id, LITERAL, "Read", "its ingress offsets, in its transactions", eos),
                Acl(TOPIC, tenant.ingress_topic, LITERAL, "Read", "its ingress offsets, in its transactions", eos)]
    out.append(Acl(TOPIC, tenant.ingress_topic, LITERAL, "Write", "cancel records (and dlq redrive --to ingress)",
                   "cancel --tenant"))
    return _unique(out + dlq_acls(tenant.dlq_topic, tenant.ingress_topic, targets, redrive=True,
                                  to=DESTINATIONS, create_topics=create_topics, tenant=True))


def dlq_acls(dlq_topic: str, ingress_topic: str, targets: Iterable[Target], *, redrive: bool,
             to: Iterable[str] = ("target",), create_topics: bool = False, tenant: bool = False) -> list[Acl]:
    """What ``dlq list`` (``redrive``: ``dlq redrive``, re-sending ``to`` these destinations) does
    to ``dlq_topic`` (sidecar/dlq.py); ``tenant``: as a tenant's principal (``--tenant``), which
    the "when" column names (else what no flag conditions says "always")."""
    marker = dlq_topic + MARKER_SUFFIX
    reading, writing = ("dlq --tenant", "dlq redrive --tenant") if tenant else ("always", "always")

    def when(flag: str) -> str:
        return f"{writing} {flag}" if tenant else flag

    out = [Acl(TOPIC, dlq_topic, LITERAL, "Read", "read the dead letters", reading),
           Acl(TOPIC, marker, LITERAL, "Read", "what was redriven", reading),
           Acl(GROUP, DLQ_GROUP_PREFIX, PREFIXED, "Describe", "the readers' groups (never joined)", reading)]
    if redrive:
        out += [Acl(TOPIC, marker, LITERAL, "Write", "record what is redriven", writing),
                Acl(TXN, TRANSACTIONAL_PREFIX + dlq_topic, LITERAL, "Write", "the redrive's transactions", writing)]
        if "ingress" in to:
            out.append(Acl(TOPIC, ingress_topic, LITERAL, "Write", "re-send through the sidecar", when("--to ingress")))
        if "target" in to:
            out += [Acl(TOPIC, t.name, t.pattern, "Write", "re-send to the target", when("--to target"))
                    for t in targets]
        if create_topics:
            out.append(Acl(TOPIC, marker, LITERAL, "Create", "create it when missing", when("--create-topics")))
    return _unique(out)


def _unique(acls: Iterable[Acl]) -> list[Acl]:
    """``acls`` without a binding already listed (the first one, and its why, stays)."""
    seen: set[tuple[str, str, str, str]] = set()
    out = []
    for a in acls:
        key = (a.resource, a.name, a.pattern, a.operation)
        if key not in seen:
            seen.add(key)
            out.append(a)
    return out


def tenant_principal(tenant: Tenant) -> str:
    """``User:<sasl.username>`` of the tenant's overrides, else a placeholder naming the tenant."""
    user = dict(tenant.kafka).get("sasl.username")
    return f"User:{user}" if user else f"User:{tenant.name}"


def open_targets(s: Settings) -> dict[str, str] | None:
    """The fields of the ``security.open_targets`` start-up warning, or None when it does not apply.

    It applies when the sidecar authenticates (``security.protocol`` SASL_* or SSL: a cluster
    with principals, hence presumably ACLs) and ``target-allowlist`` is empty: then the ingress
    topic is the only trust boundary, and whoever may write it has records delivered wherever
    this principal may write (docs/operations.md, "Security and ACLs").
    """
    protocol = s.kafka.get("security.protocol", "plaintext").upper()
    if s.target_allowlist or protocol not in ("SSL", "SASL_SSL", "SASL_PLAINTEXT"):
        return None
    return {
        "security_protocol": protocol,
        "risk": f"anyone who can write the ingress topic {s.ingress_topic!r} can have records delivered to any "
                "topic this sidecar's principal may write",
        "action": "set target-allowlist to the targets of the producers this deployment serves, and grant this "
                  "principal Write on those topics only (delay-sidecar acls --target ...)",
    }


# -- rendering ------------------------------------------------------------------------------------

_FLAG = {TOPIC: "--topic", GROUP: "--group", TXN: "--transactional-id", CLUSTER: "--cluster"}
_STRIMZI_TYPE = {TOPIC: "topic", GROUP: "group", TXN: "transactionalId", CLUSTER: "cluster"}


def render(acls: list[Acl], fmt: str, principal: str, *, bootstrap: str = "BOOTSTRAP",
           cluster: str = "my-cluster") -> str:
    """``kafka-acls``: one ``kafka-acls.sh --add`` per binding; ``strimzi``: a ``KafkaUser`` (the
    principal ``User:NAME`` is the user NAME); ``table``: markdown rows (the docs)."""
    if fmt == "kafka-acls":
        lines = [f"# {len(acls)} ACLs for {principal}; add --command-config with an admin's client properties"]
        for a in acls:
            res = [_FLAG[a.resource]] if a.resource == CLUSTER else [_FLAG[a.resource], a.name]
            pat = ["--resource-pattern-type", PREFIXED] if a.pattern == PREFIXED else []
            cmd = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--add", "--allow-principal", principal,
                   "--operation", a.operation, *res, *pat]
            lines.append(" ".join(shlex.quote(w) for w in cmd) + (f"  # {a.why}" if a.why else ""))
        return "\n".join(lines) + "\n"
    if fmt == "strimzi":
        kind, _, user = principal.partition(":")
        if kind != "User" or not user:
            raise AclInputError(f"--principal {principal!r}: a Strimzi KafkaUser is a principal User:NAME")
        return yaml.safe_dump(kafka_user(acls, user, cluster), sort_keys=False)
    if fmt == "table":
        rows = ["| resource | name | pattern | operation | when | why |", "| --- | --- | --- | --- | --- | --- |"]
        rows += [f"| {a.resource} | `{a.name}` | {a.pattern} | {a.operation} | {a.when} | {a.why} |" for a in acls]
        return "\n".join(rows) + "\n"
    raise AclInputError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")


def kafka_user(acls: list[Acl], user: str, cluster: str) -> dict[str, Any]:
    """A Strimzi ``KafkaUser`` (kafka.strimzi.io/v1beta2) with SCRAM-SHA-512 and these ACLs, the
    operations of one resource together."""
    merged: dict[tuple[str, str, str], list[str]] = {}
    for a in acls:
        merged.setdefault((a.resource, a.name, a.pattern), []).append(a.operation)
    entries = []
    for (resource, name, pattern), ops in merged.items():
        res: dict[str, str] = {"type": _STRIMZI_TYPE[resource]}
        if resource != CLUSTER:
            res.update(name=name, patternType=pattern)
        entries.append({"resource": res, "operations": ops, "host": "*"})
    return {
        "apiVersion": "kafka.strimzi.io/v1beta2",
        "kind": "KafkaUser",
        "metadata": {"name": user, "labels": {"strimzi.io/cluster": cluster}},
        "spec": {"authentication": {"type": "scram-sha-512"},
                 "authorization": {"type": "simple", "acls": entries}},
    }


# -- delay-sidecar acls ---------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "acls", help="print the Kafka ACLs a command needs (kafka-acls.sh commands or a Strimzi KafkaUser)",
        description="Print the least-privilege ACLs of --for (default: the sidecar itself) under the settings "
                    "`run` would use (--config, DELAY_SIDECAR_* environment). docs/operations.md, 'Security and "
                    "ACLs', explains each one and the trust model.",
        epilog="Targets: --target / --target-prefix, else target-allowlist entries that are a topic name or "
               r"PREFIX.* ('orders\\..*'). Without targets the sidecar may deliver nowhere.")
    p.add_argument("--config", metavar="FILE", help="the sidecar's YAML config file")
    p.add_argument("--principal", default=PRINCIPAL_DEFAULT, metavar="User:NAME",
                   help="the principal the ACLs are for (default: %(default)s)")
    p.add_argument("--format", default="kafka-acls", choices=FORMATS, help="output form (default: %(default)s)")
    p.add_argument("--for", dest="acls_for", default="run", choices=COMMANDS,
                   help="run: the sidecar; tenant: each tenant's own principal (tenants.<name>.kafka), its "
                        "deliveries and its own cancel/dlq --tenant; status, "
                        "dlq-list, dlq-redrive, accuracy: those commands; producer: an application sending delayed "
                        "records (default: %(default)s)")
    p.add_argument("--tenant", action="append", default=[], metavar="NAME",
                   help="with --for tenant (implied): only this tenant (repeatable; default: every tenant); the "
                        "principal is the tenant's sasl.username, else User:NAME, unless --principal is given")
    p.add_argument("--target", action="append", default=[], metavar="TOPIC", help="a target topic (repeatable)")
    p.add_argument("--target-prefix", action="append", default=[], metavar="PREFIX",
                   help="target topics starting with PREFIX (repeatable)")
    p.add_argument("--create-topics", action="store_true",
                   help="the command may create its missing topics (otherwise an admin creates them first)")
    p.add_argument("--redrive-to", default="target", choices=("target", "ingress"),
                   help="for dlq-redrive: where dead letters are re-sent (default: %(default)s)")
    p.add_argument("--strimzi-cluster", default="my-cluster", metavar="NAME",
                   help="the KafkaUser's strimzi.io/cluster label (default: %(default)s)")


def main(ns: argparse.Namespace) -> int:
    """``delay-sidecar acls``: the bindings, rendered, on stdout; a note on stderr without targets."""
    s = load_settings({"config": ns.config})
    targets = [Target(t) for t in ns.target] + [Target(t, PREFIXED) for t in ns.target_prefix]
    if ns.tenant or ns.acls_for == "tenant":
        return _tenants_main(ns, s, targets)
    if not targets:
        targets = targets_from_allowlist(s.target_allowlist)
    delivers = ns.acls_for in ("run", "accuracy") or (ns.acls_for == "dlq-redrive" and ns.redrive_to == "target")
    if ns.acls_for == "run" and all(ten.kafka for ten in s.tenants):
        delivers = False  # every tenant delivers as its own principal (--for tenant)
    if delivers and not targets:
        print("delay-sidecar acls: note: no target topics (--target, --target-prefix or target-allowlist): "
              "no ACL on any target is printed", file=sys.stderr)
    acls = acls_for(ns.acls_for, s, targets, create_topics=ns.create_topics, redrive_to=ns.redrive_to)
    sys.stdout.write(render(acls, ns.format, ns.principal, bootstrap=s.bootstrap_servers or "BOOTSTRAP",
                            cluster=ns.strimzi_cluster))
    return 0


def _tenants_main(ns: argparse.Namespace, s: Settings, targets: list[Target]) -> int:
    """``acls --for tenant``: each tenant's bindings under a line naming it (a YAML document each
    with ``--format strimzi``)."""
    by_name = {t.name: t for t in s.tenants}
    for name in ns.tenant:
        if name not in by_name:
            raise AclInputError(f"--tenant {name!r}: not a tenant of the configuration (its tenants: "
                                f"{', '.join(by_name)})")
    chosen = [by_name[n] for n in ns.tenant] if ns.tenant else list(by_name.values())
    given_principal = ns.principal != PRINCIPAL_DEFAULT and len(chosen) == 1
    parts = []
    for ten in chosen:
        principal = ns.principal if given_principal else tenant_principal(ten)
        acls = tenant_acls(s, ten, targets, create_topics=ns.create_topics)
        text = render(acls, ns.format, principal, bootstrap=s.bootstrap_servers or "BOOTSTRAP",
                      cluster=ns.strimzi_cluster)
        if ns.format == "strimzi":
            parts.append(text)
        else:
            note = "" if ten.kafka else " (no kafka: overrides yet: it publishes as the sidecar)"
            head = f"tenant `{ten.name}`, {principal}{note}:\n\n" if ns.format == "table" else (
                f"# tenant {ten.name}, {principal}{note}\n")
            parts.append(head + text)
    sys.stdout.write(("---\n" if ns.format == "strimzi" else "\n").join(parts))
    return 0
