"""The Helm chart (helm/kafka-delay-sidecar), rendered with the real ``helm`` binary.

``helm`` comes from PATH or ``$KDS_CACHE/bin`` (scripts/setup.d/30-helm.sh builds it there). Without
it these tests skip, except under ``CI=true`` where a missing helm is a failure.

The rendered config file is fed through ``sidecar.config.load_settings`` with the pod's environment,
so the chart is checked against the sidecar's own option table, not against a copy of it.

Every rendered variant is validated with kubernetes-validate ``strict`` against the schemas of the
oldest and newest Kubernetes that Chart.yaml's ``kubeVersion`` admits. The Prometheus Operator kinds
(ServiceMonitor, PrometheusRule) are not in those schemas: their metadata goes through Kubernetes'
ObjectMeta schema and their spec through the subset of the operator's CRD schema the chart uses.

The Grafana dashboard is decoded with grafana-foundation-sdk's generated models (Grafana 11.6) and
must survive the round trip without losing a key, with every decoded field of its declared type.
Every PromQL expression of the dashboard and the alerts is parsed with promql-parser (a port of
Prometheus' parser) and may only name series that the sidecar really renders on /metrics (a
``sidecar.metrics.Metrics`` with the quotas' collector registered), with labels those series carry.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shutil
import subprocess
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder as GrafanaJSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard
from kubernetes_validate.utils import all_versions as k8s_schema_versions
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import OPTIONS, ConfigError, Settings, load_settings
from sidecar.engine.pacing import Pacing
from sidecar.engine.quota_metrics import register as register_quota_series
from sidecar.metrics import Metrics, level_tier
from sidecar.store.quota import Quota
from sidecar.tenants import Tenant
from tests.infra import unavailable

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "kafka-delay-sidecar"
CI_TLS_SASL = CHART / "ci" / "tls-sasl-values.yaml"
CI_THREE = CHART / "ci" / "three-replicas-values.yaml"
CI_MONITORING = CHART / "ci" / "monitoring-values.yaml"
CI_TENANTS = CHART / "ci" / "tenants-values.yaml"
DASHBOARD = CHART / "dashboards" / "delay-sidecar.json"
HELM_DOC = ROOT / "docs" / "helm.md"
RELEASE = "kds"
FULLNAME = "kds-kafka-delay-sidecar"
DATA_DIR = "/var/lib/delay-sidecar"
CONFIG_PATH = "/etc/delay-sidecar/config.yaml"
# Options the chart sets itself (not in values.config).
MANAGED = {"data-dir", "http-port", "http-host", "group-instance-id"}

Doc = dict[str, Any]


def _find_helm() -> str | None:
    found = shutil.which("helm")
    if found:
        return found
    cache = Path(os.environ.get("KDS_CACHE", Path.home() / ".cache" / "kafka-delay-sidecar"))
    candidate = cache / "bin" / "helm"
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


@pytest.fixture(scope="module")
def helm() -> str:
    path = _find_helm()
    if path is None:
        unavailable("helm", "not found on PATH or in $KDS_CACHE/bin (run scripts/setup.d/30-helm.sh)")
    return path


def _run(helm: str, *args: str, chart: Path = CHART) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, *args[:1], RELEASE, str(chart), "--namespace", "delay", *args[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def render(
    helm: str, *values: Path, sets: tuple[str, ...] = (), chart: Path = CHART, kube_version: str | None = None
) -> list[Doc]:
    args = ["template"] + (["--kube-version", kube_version] if kube_version else [])
    for v in values:
        args += ["--values", str(v)]
    for s in sets:
        args += ["--set", s]
    proc = _run(helm, *args, chart=chart)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def render_error(helm: str, *sets: str) -> str:
    args = ["template"]
    for s in sets:
        args += ["--set", s]
    proc = _run(helm, *args)
    assert proc.returncode != 0, f"helm template accepted {sets}"
    return proc.stderr


def only(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {[d['kind'] for d in docs]}"
    return found[0]


def container(docs: list[Doc]) -> Doc:
    pod = only(docs, "StatefulSet")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert isinstance(c, dict)
    return c


def config_text(docs: list[Doc]) -> str:
    text = only(docs, "ConfigMap", FULLNAME)["data"]["config.yaml"]
    assert isinstance(text, str)
    return text


def config_doc(docs: list[Doc]) -> Doc:
    doc = yaml.safe_load(config_text(docs))
    assert isinstance(doc, dict)
    return doc


def env_of(docs: list[Doc]) -> dict[str, Doc]:
    return {e["name"]: e for e in container(docs).get("env", [])}


def settings_in_pod(docs: list[Doc], tmp_path: Path, secrets: dict[tuple[str, str], str]) -> Settings:
    """What the sidecar would load in pod 0: the ConfigMap's file plus the container's env, with
    fieldRefs and secretKeyRefs resolved the way the kubelet would."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config_text(docs))
    environ: dict[str, str] = {}
    for name, e in env_of(docs).items():
        if "value" in e:
            environ[name] = e["value"]
        elif "fieldRef" in e["valueFrom"]:
            assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            environ[name] = f"{FULLNAME}-0"
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            environ[name] = secrets[(ref["name"], ref["key"])]
    args = container(docs)["args"]
    assert args[:3] == ["run", "--config", CONFIG_PATH]
    return load_settings(config_file=cfg, environ=environ)


@pytest.fixture(scope="module")
def default_docs(helm: str) -> list[Doc]:
    return render(helm)


@pytest.fixture(scope="module")
def tls_docs(helm: str) -> list[Doc]:
    return render(helm, CI_TLS_SASL)


@pytest.fixture(scope="module")
def three_docs(helm: str) -> list[Doc]:
    return render(helm, CI_THREE)


# ---- lint ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [None, CI_TLS_SASL, CI_THREE, CI_MONITORING, CI_TENANTS],
    ids=["defaults", "tls-sasl", "three", "monitoring", "tenants"],
)
def test_helm_lint_strict(helm: str, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_values_files_are_the_ones_ci_lints() -> None:
    expected = [CI_TLS_SASL.name, CI_THREE.name, CI_MONITORING.name, CI_TENANTS.name]
    assert sorted(p.name for p in (CHART / "ci").glob("*.yaml")) == sorted(expected)


# ---- the objects ---------------------------------------------------------------------------


def test_default_render_objects(default_docs: list[Doc]) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in default_docs)
    assert kinds == sorted(
        [
            ("ConfigMap", FULLNAME),
            ("PodDisruptionBudget", FULLNAME),
            ("Service", f"{FULLNAME}-headless"),
            ("Service", f"{FULLNAME}-metrics"),
            ("ServiceAccount", FULLNAME),
            ("StatefulSet", FULLNAME),
        ]
    )
    for d in default_docs:
        assert d["metadata"]["namespace"] == "delay"


def test_statefulset_volume_claim_per_pod_at_the_data_dir(default_docs: list[Doc]) -> None:
    sts = only(default_docs, "StatefulSet")["spec"]
    (claim,) = sts["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "storageClassName" not in claim["spec"]  # the cluster default
    mounts = {m["name"]: m for m in container(default_docs)["volumeMounts"]}
    assert mounts["data"]["mountPath"] == DATA_DIR
    assert "data" not in {v["name"] for v in sts["template"]["spec"]["volumes"]}  # from the claim
    assert config_doc(default_docs)["data-dir"] == DATA_DIR
    assert sts["podManagementPolicy"] == "Parallel"
    assert sts["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert sts["serviceName"] == f"{FULLNAME}-headless"


def test_persistence_disabled_uses_an_empty_dir(helm: str) -> None:
    docs = render(helm, sets=("persistence.enabled=false",))
    sts = only(docs, "StatefulSet")["spec"]
    assert "volumeClaimTemplates" not in sts
    assert "persistentVolumeClaimRetentionPolicy" not in sts
    vols = {v["name"]: v for v in sts["template"]["spec"]["volumes"]}
    assert vols["data"] == {"name": "data", "emptyDir": {}}


def test_probes_hit_healthz_and_readyz_on_the_http_port(default_docs: list[Doc]) -> None:
    c = container(default_docs)
    (port,) = c["ports"]
    assert port == {"name": "http", "containerPort": 8080, "protocol": "TCP"}
    assert config_doc(default_docs)["http-port"] == 8080
    assert config_doc(default_docs)["http-host"] == "0.0.0.0"
    paths = {p: c[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert paths == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for p in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[p]["httpGet"]["port"] == "http"
    # store recovery after a crash gets minutes, not seconds
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 300


def test_http_port_value_moves_port_probes_services_and_config(helm: str) -> None:
    docs = render(helm, sets=("http.port=9404",))
    assert container(docs)["ports"][0]["containerPort"] == 9404
    assert config_doc(docs)["http-port"] == 9404
    for name in (f"{FULLNAME}-headless", f"{FULLNAME}-metrics"):
        (port,) = only(docs, "Service", name)["spec"]["ports"]
        assert port["port"] == 9404 and port["targetPort"] == "http"


def test_security_context(default_docs: list[Doc]) -> None:
    pod = only(default_docs, "StatefulSet")["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] == 10001 and psc["fsGroup"] == 10001
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(default_docs)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    # read-only root: the only writable paths are the data volume and an emptyDir /tmp
    mounts = {m["mountPath"]: m for m in container(default_docs)["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in vols[mounts["/tmp"]["name"]]
    assert mounts["/etc/delay-sidecar"]["readOnly"] is True
    assert vols["config"]["configMap"]["name"] == FULLNAME


def test_graceful_shutdown_fits_in_the_grace_period(default_docs: list[Doc], tmp_path: Path) -> None:
    pod = only(default_docs, "StatefulSet")["spec"]["template"]["spec"]
    s = settings_in_pod(default_docs, tmp_path, {})
    assert pod["terminationGracePeriodSeconds"] * 1000 > s.shutdown_timeout_ms


def test_image_defaults_to_the_app_version(default_docs: list[Doc]) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    c = container(default_docs)
    assert c["image"] == f"ghcr.io/kafka-delay-sidecar/kafka-delay-sidecar:{version}"
    assert c["imagePullPolicy"] == "IfNotPresent"


def test_pdb_selects_the_pods(default_docs: list[Doc], three_docs: list[Doc]) -> None:
    for docs in (default_docs, three_docs):
        pdb = only(docs, "PodDisruptionBudget")["spec"]
        assert pdb["maxUnavailable"] == 1
        labels = only(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
        assert pdb["selector"]["matchLabels"].items() <= labels.items()


def test_three_replicas(three_docs: list[Doc], tmp_path: Path) -> None:
    sts = only(three_docs, "StatefulSet")["spec"]
    assert sts["replicas"] == 3
    assert sts["template"]["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert container(three_docs)["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi"}
    s = settings_in_pod(three_docs, tmp_path, {})
    assert s.scheduler == "levels"  # ci/three-replicas-values.yaml picks the levels scheduler
    assert s.levels_ms[-1] == 6 * 3_600_000 and len(s.levels_ms) == 12
    assert (s.fsync, s.fsync_interval_ms) == ("interval", 200)
    assert (s.ingress_partitions, s.replication_factor) == (12, 3)


# ---- config and environment wiring ---------------------------------------------------------


def test_default_config_loads_in_the_sidecar(default_docs: list[Doc], tmp_path: Path) -> None:
    s = settings_in_pod(default_docs, tmp_path, {})
    assert s.bootstrap_servers == "kafka-bootstrap:9092"
    assert (s.ingress_topic, s.dlq_topic, s.scheduler) == ("delay.ingress", "delay.dlq", "wheel")
    assert s.data_dir == DATA_DIR and s.http_port == 8080
    assert s.kafka == {"session.timeout.ms": "45000"}
    assert "security.protocol" not in s.kafka
    assert s.group_instance_id == f"{FULLNAME}-0"


def test_static_membership_from_the_pod_name(default_docs: list[Doc], helm: str) -> None:
    e = env_of(default_docs)["DELAY_SIDECAR_GROUP_INSTANCE_ID"]
    assert e["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "group-instance-id" not in config_doc(default_docs)
    docs = render(helm, sets=("staticMembership.enabled=false",))
    assert "DELAY_SIDECAR_GROUP_INSTANCE_ID" not in env_of(docs)


def test_tls_and_sasl_wiring(tls_docs: list[Doc], tmp_path: Path) -> None:
    secrets = {("kafka-client-scram", "user"): "svc-delay", ("kafka-client-scram", "password"): "s3cr3t!"}
    s = settings_in_pod(tls_docs, tmp_path, secrets)
    assert s.bootstrap_servers == "kafka-0.kafka.data.svc:9093,kafka-1.kafka.data.svc:9093"
    assert (s.ingress_topic, s.dlq_topic, s.scheduler) == (
        "orders.delay.ingress",
        "orders.delay.dlq",
        "wheel",
    )
    assert s.wheel_precision_ms == 10 and s.max_retries == 8
    assert s.retry_ladder_ms == (10_000, 30_000, 60_000, 300_000)
    assert s.target_allowlist == (r"orders\..*",)
    assert s.kafka == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc-delay",
        "sasl.password": "s3cr3t!",
        "ssl.ca.location": "/etc/kafka-tls/ca.crt",
        "ssl.certificate.location": "/etc/kafka-tls/tls.crt",
        "ssl.key.location": "/etc/kafka-tls/tls.key",
        "ssl.endpoint.identification.algorithm": "https",
        "session.timeout.ms": "30000",
        "client.id": "delay-sidecar",
    }

    # the credentials come only from the Secret, never through the ConfigMap
    env = env_of(tls_docs)
    for var, key in (
        ("DELAY_SIDECAR_KAFKA_SASL_USERNAME", "user"),
        ("DELAY_SIDECAR_KAFKA_SASL_PASSWORD", "password"),
    ):
        assert env[var]["valueFrom"] == {"secretKeyRef": {"name": "kafka-client-scram", "key": key}}
        assert "value" not in env[var]
    text = config_text(tls_docs)
    assert "sasl.password" not in text and "sasl.username" not in text
    assert "kafka-client-scram" not in text
    assert env["TZ"] == {"name": "TZ", "value": "UTC"}  # extraEnv

    # the TLS Secret is mounted read-only where the config points
    pod = only(tls_docs, "StatefulSet")["spec"]["template"]["spec"]
    mount = next(m for m in container(tls_docs)["volumeMounts"] if m["mountPath"] == "/etc/kafka-tls")
    assert mount["readOnly"] is True
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])["secret"]
    assert vol["secretName"] == "kafka-client-tls"
    assert {i["path"] for i in vol["items"]} == {"ca.crt", "tls.crt", "tls.key"}
    assert vol["defaultMode"] & 0o007 == 0  # not world-readable

    claim = only(tls_docs, "StatefulSet")["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast-ssd"
    assert claim["resources"]["requests"]["storage"] == "50Gi"


def test_sasl_without_tls_is_sasl_plaintext(helm: str, tmp_path: Path) -> None:
    docs = render(helm, sets=("sasl.enabled=true", "sasl.existingSecret=creds", "sasl.mechanism=PLAIN"))
    s = settings_in_pod(docs, tmp_path, {("creds", "username"): "u", ("creds", "password"): "p"})
    assert s.kafka["security.protocol"] == "SASL_PLAINTEXT" and s.kafka["sasl.mechanism"] == "PLAIN"
    assert not any(k.startswith("ssl.") for k in s.kafka)
    assert not any(m["mountPath"] == "/etc/kafka-tls" for m in container(docs)["volumeMounts"])


def test_tls_only_is_ssl_without_client_cert(helm: str, tmp_path: Path) -> None:
    docs = render(helm, sets=("tls.enabled=true", "tls.existingSecret=ca"))
    s = settings_in_pod(docs, tmp_path, {})
    assert s.kafka["security.protocol"] == "SSL"
    assert s.kafka["ssl.ca.location"] == "/etc/kafka-tls/ca.crt"
    assert "ssl.key.location" not in s.kafka and "sasl.mechanism" not in s.kafka


def test_kafka_map_overrides_derived_properties(helm: str, tmp_path: Path) -> None:
    docs = render(
        helm,
        sets=(
            "tls.enabled=true",
            "tls.existingSecret=ca",
            r"kafka.security\.protocol=SSL",
            r"kafka.ssl\.ca\.location=/etc/ssl/certs/ca-certificates.crt",
            r"kafka.linger\.ms=5",
            r"kafka.enable\.idempotence=true",
            r"kafka.session\.timeout\.ms=null",
        ),
    )
    s = settings_in_pod(docs, tmp_path, {})
    assert s.kafka["ssl.ca.location"] == "/etc/ssl/certs/ca-certificates.crt"
    assert s.kafka["linger.ms"] == "5" and s.kafka["enable.idempotence"] == "true"
    assert "session.timeout.ms" not in s.kafka


def camel(option: str) -> str:
    head, *rest = option.split("-")
    return head + "".join(p.capitalize() for p in rest)


def _value_of(default: Any) -> Any:
    return list(default) if isinstance(default, tuple) else default


def test_every_sidecar_option_is_a_chart_value(helm: str, tmp_path: Path) -> None:
    """values.schema.json's `config` lists every option of sidecar/config.py except the ones the
    chart manages, and each renders under its own flag name and loads with the sidecar's parser."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    props = set(schema["properties"]["config"]["properties"])
    assert {camel(o.name) for o in OPTIONS if o.name not in MANAGED} == props

    values = {camel(o.name): _value_of(o.default) for o in OPTIONS if o.name not in MANAGED}
    values["bootstrapServers"] = "broker:9092"
    vfile = tmp_path / "all.yaml"
    vfile.write_text(yaml.safe_dump({"config": values}))
    docs = render(helm, vfile)
    doc = config_doc(docs)
    unset = {o.name for o in OPTIONS if o.name not in MANAGED and values[camel(o.name)] is None}
    # null: the option's default (<ingress-topic>.changelog; no history topic; the pod's own address)
    assert unset == {"changelog-topic", "history-topic", "advertised-address"}
    assert set(doc) - {"kafka"} == {o.name for o in OPTIONS} - {"group-instance-id"} - unset
    s = settings_in_pod(docs, tmp_path, {})
    expected = Settings(
        bootstrap_servers="broker:9092",
        data_dir=DATA_DIR,
        http_port=8080,
        group_instance_id=f"{FULLNAME}-0",
        kafka={"session.timeout.ms": "45000"},
    )
    assert s == expected


@pytest.mark.parametrize(
    ("values_text", "sets", "changelog", "topic"),
    [
        ("", (), "on", "delay.ingress.changelog"),  # the chart's default
        ("config:\n  changelog: off\n", (), "off", None),  # unquoted: a YAML boolean
        ("config:\n  changelog: on\n  ingressTopic: orders.delay\n", (), "on", "orders.delay.changelog"),
        ("config:\n  changelog: 'off'\n", (), "off", None),
        ("", ("config.changelog=off",), "off", None),
        ("", ("config.changelogTopic=orders.delay.changelog",), "on", "orders.delay.changelog"),
    ],
)
def test_changelog_values_load_in_the_sidecar(
    helm: str, tmp_path: Path, values_text: str, sets: tuple[str, ...], changelog: str, topic: str | None
) -> None:
    """`changelog` is on by default; YAML's unquoted on/off (booleans to Helm and to the sidecar's
    YAML reader alike) render as the words the sidecar accepts."""
    vfile = tmp_path / "changelog.yaml"
    vfile.write_text(values_text)
    docs = render(helm, vfile, sets=sets)
    assert config_doc(docs)["changelog"] in ("on", "off")  # a string, not a boolean
    s = settings_in_pod(docs, tmp_path, {})
    assert (s.changelog, s.changelog_topic_name) == (changelog, topic)
    assert s.group_instance_id == f"{FULLNAME}-0"  # the pod name, not an id kept on the volume


def test_schema_is_strict_at_every_level() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_maps = {"kafka", "podSecurityContext", "securityContext", "affinity", "global"}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                assert node.get("additionalProperties") is False, f"{path or '/'} accepts unknown keys"
            for k, v in node.get("properties", {}).items():
                if k not in open_maps:
                    walk(v, f"{path}/{k}")
            for k, v in node.get("definitions", {}).items():
                walk(v, f"#/definitions/{k}")

    walk(schema, "")
    assert schema["required"] and "config" in schema["required"]
    assert schema["properties"]["config"]["required"] == ["bootstrapServers"]


# ---- metrics -------------------------------------------------------------------------------


def test_service_monitor_only_when_enabled(default_docs: list[Doc], tls_docs: list[Doc]) -> None:
    assert not [d for d in default_docs if d["kind"] == "ServiceMonitor"]
    sm = only(tls_docs, "ServiceMonitor")
    svc = only(tls_docs, "Service", f"{FULLNAME}-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    headless = only(tls_docs, "Service", f"{FULLNAME}-headless")
    assert not sm["spec"]["selector"]["matchLabels"].items() <= headless["metadata"]["labels"].items()
    (ep,) = sm["spec"]["endpoints"]
    assert ep["path"] == "/metrics"
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["delay"]}


def test_services(default_docs: list[Doc]) -> None:
    headless = only(default_docs, "Service", f"{FULLNAME}-headless")["spec"]
    assert headless["clusterIP"] == "None"
    labels = only(default_docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    for name in (f"{FULLNAME}-headless", f"{FULLNAME}-metrics"):
        spec = only(default_docs, "Service", name)["spec"]
        assert spec["selector"].items() <= labels.items()
        assert spec["publishNotReadyAddresses"] is True


# ---- rejected values -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("config.scheduler=foo",), r"/config/scheduler.*levels.*wheel"),
        (("bogus=1",), r"additional properties 'bogus' not allowed"),
        (("config.maxDelay=forever",), r"/config/maxDelay"),
        (("config.fsync=sometimes",), r"/config/fsync"),
        (("config.ingressTopic=a/b",), r"/config/ingressTopic"),
        (("config.changelog=maybe",), r"/config/changelog.*'on', 'off'"),
        (("config.changelogTopic=a/b",), r"/config/changelogTopic"),
        (("config.dataDir=/elsewhere",), r"additional properties 'dataDir' not allowed"),
        (("config.bootstrapServers=",), r"/config/bootstrapServers"),
        (("config.bootstrapServers=null",), r"bootstrapServers"),
        (("replicaCount=0",), r"/replicaCount"),
        (("probes.readiness.path=/x",), r"additional properties 'path' not allowed"),
        (("sasl.mechanism=GSSAPI",), r"/sasl/mechanism"),
        (
            (r"kafka.sasl\.password=hunter2",),
            r"kafka.sasl.password looks like a secret.*"
            r"DELAY_SIDECAR_KAFKA_SASL_PASSWORD",
        ),
        (("tls.enabled=true",), r"tls.enabled=true needs tls.existingSecret"),
        (("sasl.enabled=true",), r"sasl.enabled=true needs sasl.existingSecret"),
        (("config.shutdownTimeout=2m",), r"terminationGracePeriodSeconds \(45\) must exceed"),
    ],
)
def test_invalid_values_fail_with_a_message(helm: str, sets: tuple[str, ...], message: str) -> None:
    err = render_error(helm, *sets)
    assert re.search(message, err, re.S), err


def test_invalid_values_leave_no_secret_in_output(helm: str) -> None:
    err = render_error(helm, r"kafka.sasl\.password=hunter2")
    assert "hunter2" not in err


# ---- durations and sizes: the schema accepts what the sidecar accepts -------------------------

# Written forms of sidecar/durations.py, accepted and refused; the schema must agree with the
# option's own parser on every one (lists are strictly increasing so that `levels` agrees too).
# Not covered: a duration beyond 2**63-1 ms (the sidecar refuses it, the pattern cannot count).
FORM_SAMPLES: dict[str, list[Any]] = {
    "duration": [
        "5s", " 5s ", "\t2h\n", "250ms", "400d", "10m", "0ms", "000s", "1000", 1000, 0, "5 s", "-5s", "+5s",
        "1.5s", "5S", "5sec", "5", "", " ", "1s 5s", "s", True, 1.5,
    ],
    "durationList": [
        "1s 5s 10s", "1s,5s,10s", "1s, 5s ,10s", " ,1s,5s, ", "1s\n5s", "250ms", ["1s", "5s"], ["1s", "", "5s"],
        [" 1s "], "1s 5", "1s 5 s", "1s5s", "1s;5s", "", " , ", [], [""], ["1s", 5], [1000], ["1s 5s"], 1000,
    ],
    "size": [
        "64MiB", "64mib", " 10GB ", "1048576", 1048576, "1b", "2k", "0", 0, "0MiB", "64 MiB", "-1", -1,
        "1.5GB", "64MiBs", "", "10Q", True, 1.5,
    ],
}
FORM_SAMPLES["positiveDuration"] = FORM_SAMPLES["duration"]
FORM_SAMPLES["positiveSize"] = FORM_SAMPLES["size"]


def _schema() -> Doc:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert isinstance(schema, dict)
    return schema


def _form_props() -> list[tuple[str, str]]:
    """(config value, definition) for every config value that is a duration, list or size."""
    props = _schema()["properties"]["config"]["properties"]
    refs = {k: v.get("$ref", "").rpartition("/")[2] for k, v in props.items()}
    return [(k, d) for k, d in refs.items() if d in FORM_SAMPLES]


def test_every_duration_and_size_value_uses_a_form_definition() -> None:
    kinds = {k: kind for k, kind in _form_props()}
    metavars = {camel(o.name): o.metavar for o in OPTIONS if o.metavar in {"DURATION", "DURATIONS", "SIZE"}}
    expected = {"DURATION": {"duration", "positiveDuration"}, "DURATIONS": {"durationList"},
                "SIZE": {"size", "positiveSize"}}
    assert set(kinds) == set(metavars)
    for key, metavar in metavars.items():
        assert kinds[key] in expected[metavar], key


@pytest.mark.parametrize(("key", "kind"), _form_props())
def test_schema_accepts_exactly_what_the_sidecar_accepts(key: str, kind: str) -> None:
    option = {camel(o.name): o for o in OPTIONS}[key]
    validator = jsonschema.Draft7Validator(_schema())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    disagree = []
    for sample in FORM_SAMPLES[kind]:
        values["config"][key] = sample
        by_schema = validator.is_valid(values)
        try:
            option.parse(sample)
            by_sidecar = True
        except ValueError:
            by_sidecar = False
        if by_schema != by_sidecar:
            disagree.append(f"{sample!r}: schema {'accepts' if by_schema else 'refuses'}, sidecar "
                            f"{'accepts' if by_sidecar else 'refuses'}")
    assert not disagree, f"config.{key} ({kind}):\n" + "\n".join(disagree)


@pytest.mark.parametrize(
    ("key", "given", "in_yaml"),
    [
        ("commitInterval", "1000", 1000),
        ("commitInterval", "5 s", "5 s"),
        ("maxDelay", "1000", 1000),
        ("shutdownTimeout", "5 s", "5 s"),
        ("fsyncInterval", "1.5s", "1.5s"),
        ("deliveryGrace", "-5s", "-5s"),
        ("wheelPrecision", "0ms", "0ms"),
        ("levels", "1s 5", "1s 5"),
        ("retryLadder", "{10s,30}", ["10s", 30]),
        ("segmentBytes", "64 MiB", "64 MiB"),
        ("maxRecordBytes", "0", 0),
    ],
)
def test_chart_refuses_what_the_sidecar_refuses(helm: str, tmp_path: Path, key: str, given: str,
                                                in_yaml: Any) -> None:
    """helm template fails on the value, naming it; the sidecar refuses the same value in its
    config file (what the ConfigMap would have held)."""
    err = render_error(helm, f"config.{key}={given}")
    assert f"/config/{key}" in err, err
    option = next(o.name for o in OPTIONS if camel(o.name) == key)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"bootstrap-servers": "b:9092", option: in_yaml}))
    with pytest.raises(ConfigError, match=f"bad value for {option}:"):
        load_settings(config_file=cfg, environ={})


def test_accepted_forms_load_in_the_sidecar(helm: str, tmp_path: Path) -> None:
    """Spellings the schema accepts besides the plain ones render into a config the sidecar loads
    to the intended values (Go's regular expressions, not Python's, judge the schema here)."""
    vfile = tmp_path / "forms.yaml"
    vfile.write_text(
        "config:\n"
        "  commitInterval: ' 5s '\n"
        "  fsyncInterval: 0ms\n"
        "  maxDelay: 400d\n"
        "  wheelPrecision: 250ms\n"
        "  shutdownTimeout: 20s\n"
        "  levels: ['1s', '', ' 5s', 2h]\n"
        "  retryLadder: ',10s, 1m 5m,'\n"
        "  segmentBytes: 128mib\n"
        "  maxRecordBytes: ' 2MB '\n"
        "  diskMaxBytes: 10GB\n"
        "  diskMinFreeBytes: 0\n"
    )
    s = settings_in_pod(render(helm, vfile, sets=("config.cancelHorizon=36h",)), tmp_path, {})
    assert (s.commit_interval_ms, s.fsync_interval_ms, s.max_delay_ms) == (5000, 0, 400 * 86_400_000)
    assert (s.wheel_precision_ms, s.shutdown_timeout_ms, s.cancel_horizon_ms) == (250, 20_000, 36 * 3_600_000)
    assert s.levels_ms == (1000, 5000, 7_200_000)
    assert s.retry_ladder_ms == (10_000, 60_000, 300_000)
    assert (s.segment_bytes, s.max_record_bytes) == (128 * 1024**2, 2_000_000)
    assert (s.disk_max_bytes, s.disk_min_free_bytes) == (10**10, 0)


# ---- NOTES.txt -----------------------------------------------------------------------------


def test_notes_explain_sending_headers_and_logs(helm: str, tmp_path: Path) -> None:
    """`helm template` does not render NOTES.txt; render it through tpl in a copy of the chart."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rendered-notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}\n'
    )
    notes = only(render(helm, CI_TLS_SASL, chart=chart), "ConfigMap", "rendered-notes")["data"]["notes"]
    for header in (
        "delay.target-topic",
        "delay.ms",
        "delay.deliver-at",
        "delay.level",
        "delay.id",
        "delay.cancel",
        "delay.retry-count",
        "delay.target-partition",
        "delay.dlq.reason",
    ):
        assert header in notes
    assert "-t orders.delay.ingress" in notes and "orders.delay.dlq" in notes
    assert f"kubectl -n delay logs -f {FULLNAME}-0" in notes
    assert "/readyz" in notes and "/metrics" in notes
    assert "group.instance.id" in notes
    assert 'changelog topic "orders.delay.ingress.changelog"' in notes and "Scaling up and down is safe" in notes
    off = only(render(helm, CI_TLS_SASL, sets=("config.changelog=off",), chart=chart), "ConfigMap", "rendered-notes")
    assert "single-instance mode" in off["data"]["notes"] and "changelog topic" not in off["data"]["notes"]
    assert "placeholder" not in notes
    assert "TRUST:" not in notes  # SASL and TLS on, but config.targetAllowlist narrows the targets
    open_targets = only(render(helm, sets=("sasl.enabled=true", "sasl.existingSecret=s"), chart=chart),
                        "ConfigMap", "rendered-notes")["data"]["notes"]
    assert 'TRUST: anyone who can write the ingress topic "delay.ingress"' in open_targets
    defaults = only(render(helm, chart=chart), "ConfigMap", "rendered-notes")["data"]["notes"]
    assert "placeholder" in defaults  # warns while bootstrapServers is the default


# ---- Kubernetes' own schemas ---------------------------------------------------------------

MONITORING_ON = (
    "metrics.serviceMonitor.enabled=true",
    "metrics.grafanaDashboard.enabled=true",
    "metrics.prometheusRule.enabled=true",
)
# Every way the chart is rendered in CI: defaults, each ci/*.yaml, and all monitoring objects on.
VARIANTS: dict[str, tuple[tuple[Path, ...], tuple[str, ...]]] = {
    "defaults": ((), ()),
    **{p.stem: ((p,), ()) for p in sorted((CHART / "ci").glob("*.yaml"))},
    "monitoring-on-defaults": ((), MONITORING_ON),
}
# the series with a tenant label (sidecar/metrics.py): the dashboard's $tenant narrows them
PER_TENANT = ("delay_sidecar_pending_records", "delay_sidecar_delivered_records_total",
              "delay_sidecar_delivery_lateness_seconds_bucket", "delay_sidecar_dlq_records_total",
              "delay_sidecar_quota_rejections_total", "delay_sidecar_pacing_lag_seconds",
              "delay_sidecar_consumer_lag_records")
# Labels Prometheus attaches to every target of a ServiceMonitor scrape (not the sidecar's own).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
# Series the dashboard and alerts may use that are not the sidecar's: Prometheus' per-target `up`.
PROMETHEUS_SERIES = {"up": TARGET_LABELS}
# Series the dashboard shows ahead of the sidecar rendering them: the store's preallocated bytes,
# which come with the change that makes store_bytes the allocated bytes. An entry fails
# test_preallocated_bytes_waits_for_the_store_change once Metrics renders it.
NOT_YET_EXPOSED: set[str] = set()


def _supported_kube_versions() -> tuple[str, str]:
    """Oldest and newest Kubernetes minor that Chart.yaml's kubeVersion admits:
    ``>=1.27.0-0 <1.38.0-0`` -> ("1.27.0", "1.37.0")."""
    kube = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    m = re.fullmatch(r">=\s*1\.(\d+)\.0-0\s+<\s*1\.(\d+)\.0-0", kube)
    assert m, f"kubeVersion {kube!r} is not of the form '>=1.A.0-0 <1.B.0-0'"
    return f"1.{m.group(1)}.0", f"1.{int(m.group(2)) - 1}.0"


KUBE_VERSIONS = _supported_kube_versions()


def test_kube_version_range_is_one_kubernetes_validate_has_schemas_for(helm: str) -> None:
    shipped = set(k8s_schema_versions())
    for v in KUBE_VERSIONS:
        assert v in shipped, f"kubernetes-validate has no schemas for {v} (it has {sorted(shipped)})"
    oldest, newest = (tuple(int(x) for x in v.split(".")) for v in KUBE_VERSIONS)
    for outside in (f"1.{oldest[1] - 1}.0", f"1.{newest[1] + 1}.0"):
        proc = _run(helm, "template", "--kube-version", outside)
        assert proc.returncode != 0 and "kubeVersion" in proc.stderr, (outside, proc.stderr)


# The parts of the Prometheus Operator CRDs (monitoring.coreos.com/v1, operator 0.8x:
# monitoring.coreos.com_servicemonitors.yaml / _prometheusrules.yaml) that this chart writes,
# transcribed with their types and duration patterns. additionalProperties is false here although
# the CRDs are open: the API server prunes unknown fields there silently, so a misspelt key would
# vanish instead of failing.
PROM_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
CRD_SPEC_SCHEMAS: dict[str, Doc] = {
    "ServiceMonitor": {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "endpoints"],
        "properties": {
            "namespaceSelector": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                },
            },
            "selector": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"matchLabels": STRING_MAP},
            },
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["port"],
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "interval": {"type": "string", "pattern": PROM_DURATION},
                        "scrapeTimeout": {"type": "string", "pattern": PROM_DURATION},
                    },
                },
            },
        },
    },
    "PrometheusRule": {
        "type": "object",
        "additionalProperties": False,
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "rules": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["alert", "expr", "labels", "annotations"],
                                "properties": {
                                    "alert": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9]*$"},
                                    "expr": {"type": "string"},
                                    "for": {"type": "string", "pattern": PROM_DURATION},
                                    "labels": STRING_MAP,
                                    "annotations": STRING_MAP,
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def validate_manifest(doc: Doc, version: str) -> None:
    kind = doc["kind"]
    if kind in CRD_SPEC_SCHEMAS:
        assert doc["apiVersion"] == "monitoring.coreos.com/v1", doc["apiVersion"]
        assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}, sorted(doc)
        # ObjectMeta through Kubernetes' own schema, by way of a kind that has nothing else required
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}, version, strict=True
        )
        jsonschema.validate(doc["spec"], CRD_SPEC_SCHEMAS[kind])
    else:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_manifests_pass_kubernetes_schemas_strictly(helm: str, variant: str, version: str) -> None:
    values, sets = VARIANTS[variant]
    docs = render(helm, *values, sets=sets, kube_version=version)
    for doc in docs:
        try:
            validate_manifest(doc, version)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as e:
            pytest.fail(
                f"{doc['kind']}/{doc['metadata']['name']} ({variant}, Kubernetes {version}): {e.message} "
                f"at {'/'.join(str(p) for p in e.absolute_path)}"
            )
    if "monitoring" in variant:
        assert {"ServiceMonitor", "PrometheusRule"} <= {d["kind"] for d in docs}


@pytest.mark.parametrize(
    ("kind", "break_it"),
    [
        ("StatefulSet", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicy2="Always")),
        ("Service", lambda d: d["spec"]["ports"][0].update(port="http")),
        ("ConfigMap", lambda d: d["metadata"]["labels"].update(grafana_dashboard=1)),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(interval="30 s")),
        ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].update(fro="5m")),
        ("PrometheusRule", lambda d: d["metadata"].update(lables={})),
    ],
)
def test_the_schema_check_rejects_broken_manifests(helm: str, kind: str, break_it: Any) -> None:
    """The validation above is live: one broken field in a rendered object fails it."""
    doc = [d for d in render(helm, CI_MONITORING) if d["kind"] == kind][-1]
    validate_manifest(doc, KUBE_VERSIONS[0])
    break_it(doc)
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate_manifest(doc, KUBE_VERSIONS[0])


# ---- Grafana dashboard ---------------------------------------------------------------------


def dashboard() -> Doc:
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


def panels() -> list[Doc]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def test_dashboard_config_map_only_when_enabled(helm: str, default_docs: list[Doc]) -> None:
    assert not [d for d in default_docs if d["metadata"]["name"].endswith("-dashboard")]
    docs = render(helm, CI_MONITORING)
    cm = only(docs, "ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Kafka"}
    assert json.loads(cm["data"]["kafka-delay-sidecar.json"]) == dashboard()

    docs = render(
        helm,
        sets=(
            "metrics.grafanaDashboard.enabled=true",
            "metrics.grafanaDashboard.labelKey=example.com/dashboard",
            "metrics.grafanaDashboard.labelValue=delay",
        ),
    )
    cm = only(docs, "ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["namespace"] == "delay"
    assert cm["metadata"]["labels"]["example.com/dashboard"] == "delay"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]


def _lost_keys(original: Any, decoded: Any, path: str = "") -> list[str]:
    """Paths of `original` that are missing or different in `decoded`."""
    if isinstance(original, dict):
        if not isinstance(decoded, dict):
            return [f"{path or '/'}: became {type(decoded).__name__}"]
        out: list[str] = []
        for k, v in original.items():
            if k not in decoded:
                out.append(f"{path}/{k}: unknown to the model")
            else:
                out += _lost_keys(v, decoded[k], f"{path}/{k}")
        return out
    if isinstance(original, list):
        if not isinstance(decoded, list) or len(decoded) != len(original):
            return [f"{path}: list changed"]
        pairs = enumerate(zip(original, decoded, strict=True))
        return [e for i, (a, b) in pairs for e in _lost_keys(a, b, f"{path}[{i}]")]
    return [] if original == decoded else [f"{path}: {original!r} became {decoded!r}"]


def _type_errors(obj: Any, path: str) -> list[str]:
    """Every annotated field of a decoded grafana-foundation-sdk model object (recursively) holds a
    value of its declared type; enums accept their members' values."""
    errors: list[str] = []

    def fits(v: Any, hint: Any, where: str) -> bool:
        if hint is Any or hint is object:
            if hasattr(v, "to_json") and getattr(type(v), "__annotations__", None):
                errors.extend(_type_errors(v, where))  # panel options / field config decoded per plugin
            return True
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            members = typing.get_args(hint)
            if any(clean_fit(v, h) for h in members):
                return True
            # no member fits cleanly: report the nested problems of the member v is an instance of
            loose = [h for h in members if isinstance(h, type) and isinstance(v, h)]
            return bool(loose) and fits(v, loose[0], where)
        if origin is list:
            (item,) = typing.get_args(hint)
            return isinstance(v, list) and all(fits(x, item, f"{where}[{i}]") for i, x in enumerate(v))
        if origin is dict:
            _, item = typing.get_args(hint)
            return isinstance(v, dict) and all(fits(x, item, f"{where}.{k}") for k, x in v.items())
        if origin is typing.Literal:
            return v in typing.get_args(hint)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return isinstance(v, hint) or v in {m.value for m in hint}
        if hint is float:
            return isinstance(v, int | float) and not isinstance(v, bool)
        if hint is int:
            return isinstance(v, int) and not isinstance(v, bool)
        assert isinstance(hint, type), f"{where}: type hint {hint!r} not handled"
        if not isinstance(v, hint):
            return False
        if hasattr(v, "to_json"):
            errors.extend(_type_errors(v, where))
        return True

    def clean_fit(v: Any, hint: Any) -> bool:
        """`v` is a `hint` all the way down (for picking the member of a union)."""
        before = len(errors)
        ok = fits(v, hint, "")
        ok = ok and len(errors) == before
        del errors[before:]
        return ok

    for name, hint in typing.get_type_hints(type(obj)).items():
        value = getattr(obj, name)
        if not fits(value, hint, f"{path}.{name}"):
            errors.append(f"{path}.{name}: {value!r:.200} is not {hint}")
    return errors


def test_dashboard_is_a_valid_grafana_dashboard() -> None:
    """Decoded by grafana-foundation-sdk's generated models (Grafana 11.6 schema, with the panel and
    Prometheus query plugins registered): every key is one the schema knows (the model drops
    unknown keys, so a round trip that loses one fails) and every field has the schema's type."""
    register_default_plugins()
    doc = dashboard()
    model = Dashboard.from_json(doc)
    assert _type_errors(model, "dashboard") == []
    again = json.loads(json.dumps(model, cls=GrafanaJSONEncoder))
    assert _lost_keys(doc, again) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("graphTooltip",), 5),
        (("panels", 1, "gridPos", "h"), "4"),
        (("panels", 6, "fieldConfig", "defaults", "custom", "drawStyle"), "lines"),
        (("panels", 6, "options", "legend", "displayMode"), "tabel"),
        (("panels", 1, "options", "reduceOptions", "calcs"), "lastNotNull"),
        (("panels", 6, "targets", 0, "legendFromat"), "x"),
    ],
)
def test_dashboard_validation_rejects_a_broken_dashboard(path: tuple[str | int, ...], value: Any) -> None:
    register_default_plugins()
    doc = dashboard()
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    model = Dashboard.from_json(doc)
    again = json.loads(json.dumps(model, cls=GrafanaJSONEncoder))
    assert _type_errors(model, "dashboard") or _lost_keys(doc, again)


def test_dashboard_shape() -> None:
    doc = dashboard()
    assert doc["uid"] == "kafka-delay-sidecar"
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "namespace", "pod", "tenant"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in doc["panels"]]
    assert len(titles) == len(set(titles))
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        assert p["description"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert '{namespace=~"$namespace", pod=~"$pod"' in t["expr"], (p["title"], t["expr"])
            for name in PER_TENANT:  # a per-tenant series is narrowed to the chosen tenants
                if name in t["expr"]:
                    assert f'{name}{{namespace=~"$namespace", pod=~"$pod", tenant=~"$tenant"}}' in t["expr"], (
                        p["title"], t["expr"])
    # no two panels overlap
    cells: set[tuple[int, int]] = set()
    for p in doc["panels"]:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, p["title"]
        cells |= mine


# ---- PromQL against the series the sidecar renders -----------------------------------------


def exposed_series() -> dict[str, set[str]]:
    """Sample name -> label names, from the text a real Metrics object renders on /metrics (with
    the quotas' collector registered as the engine does, for a tenant with every limit), with
    every labelled family given a child so that no family renders without samples."""
    m = Metrics(ingress_topic="delay.ingress", scheduler="levels", tiers=[level_tier(1)])
    limited = Tenant(name="team-a", ingress_topic="delay.ingress", dlq_topic="delay.dlq", target_allowlist=(),
                     max_delay_ms=1000, changelog_topic=None, max_pending=10, max_disk_bytes=1 << 20,
                     max_delivery_rate=5.0)
    register_quota_series(m.registry, [Quota(limited.name, limited.max_pending, limited.max_disk_bytes, tuple)],
                          Pacing([limited], 0))
    m.set_consumer_lag(0, 5)
    m.set_ingress_paused(True, "disk-full")
    m.observe_lateness_ms([3, -1])
    m.set_changelog({0: 3}, {0: 1}, {1: 40})  # p0 owned (writes in flight), p1 restoring
    m.restored(12)
    m.set_standby_lag({2: 7})  # p2 a standby
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(m.render().decode()):
        assert family.samples, f"{family.name} rendered without samples"
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


GRAFANA_RANGES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "3h"}


def parse_promql(expr: str) -> Any:
    for var, value in GRAFANA_RANGES.items():
        expr = expr.replace(var, value)
    try:
        return promql_parser.parse(expr)
    except ValueError as e:
        pytest.fail(f"not PromQL ({e}): {expr}")


def selectors(tree: Any) -> list[Any]:
    found: list[Any] = []
    promql_parser.walk(tree, lambda n: found.append(n) if isinstance(n, promql_parser.VectorSelector) else None)
    return found


def check_promql(expr: str, series: dict[str, set[str]]) -> list[str]:
    """Problems of one expression: a series the sidecar does not render, a matcher or a `by` label
    that the series it applies to does not carry (and Prometheus does not attach to targets)."""
    tree = parse_promql(expr)
    known = {**series, **PROMETHEUS_SERIES}
    problems: list[str] = []
    for vs in selectors(tree):
        name = vs.name or next((m.value for m in vs.matchers.matchers if m.name == "__name__"), None)
        if name in NOT_YET_EXPOSED:
            continue
        if name not in known:
            problems.append(f"{name}: not rendered by the sidecar")
            continue
        for matcher in vs.matchers.matchers:
            if matcher.name != "__name__" and matcher.name not in known[name] | TARGET_LABELS:
                problems.append(f"{name}{{{matcher.name}}}: no such label")

    def grouping(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            inner = [vs.name for vs in selectors(node.expr) if vs.name in known]
            for label in node.modifier.labels:
                if label not in TARGET_LABELS and not all(label in known[n] for n in inner):
                    problems.append(f"by ({label}) over {inner}: not a label of all of them")

    promql_parser.walk(tree, grouping)
    return problems


def by_labels(expr: str) -> set[str]:
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            found.update(node.modifier.labels)

    promql_parser.walk(parse_promql(expr), visit)
    return found


def test_dashboard_queries_name_only_series_the_sidecar_renders() -> None:
    series = exposed_series()
    problems: list[str] = []
    for p in panels():
        for t in p["targets"]:
            problems += [f"{p['title']}: {e}" for e in check_promql(t["expr"], series)]
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")):
                if label not in by_labels(t["expr"]):
                    problems.append(f"{p['title']}: legend {{{{{label}}}}} is not kept by {t['expr']}")
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
            assert m, var
            problems += [f"${var['name']}: {e}" for e in check_promql(m.group(1), series)]
            assert m.group(2) in TARGET_LABELS or m.group(2) in series[selectors(parse_promql(m.group(1)))[0].name]
    assert problems == []


def test_preallocated_bytes_waits_for_the_store_change() -> None:
    assert not NOT_YET_EXPOSED & set(exposed_series()), (
        f"sidecar.metrics now renders {NOT_YET_EXPOSED & set(exposed_series())}: remove it from NOT_YET_EXPOSED"
    )


def test_promql_check_catches_renamed_series_and_labels() -> None:
    series = exposed_series()
    assert check_promql('sum by (tier) (delay_sidecar_pending_records{pod=~"$pod"})', series) == []
    assert check_promql("sum(rate(delay_sidecar_ingested_total[$__rate_interval]))", series)
    assert check_promql("sum by (level) (delay_sidecar_pending_records)", series)
    assert check_promql('delay_sidecar_dlq_records_total{code="bad-header"}', series)


def test_dashboard_covers_the_sidecar_series() -> None:
    """Every series family the sidecar renders is on the dashboard, except the ones listed."""
    not_shown = {
        "delay_sidecar_scheduled_records_total",  # = ingested, split by scheduler
        "delay_sidecar_ingress_paused_reason",  # reason is free text; the pause itself is shown
        "delay_sidecar_delivery_lateness_seconds_sum",
        "delay_sidecar_delivery_lateness_seconds_count",
    }
    used = {vs.name for p in panels() for t in p["targets"] for vs in selectors(parse_promql(t["expr"]))}
    rendered = {n for n in exposed_series() if not n.endswith("_created")}
    assert rendered - not_shown - used == set()
    titles = {p["title"] for p in panels()}
    for want in (
        "Ingest and delivery rate",
        "Pending by tier",
        "Delivery lateness p50 / p99",
        "Early deliveries (must stay 0)",
        "DLQ by reason",
        "Consumer lag per partition",
        "Early deliveries over time",
        "Store disk",
        "Ingress paused per pod",
        "Ready per pod",
        "Restore remaining per partition",
        "Restore rate",
        "Changelog unacknowledged writes",
        "Changelog refused writes (must stay 0)",
        "Quota rejections by tenant and reason",
        "Pacing lag by tenant (max-delivery-rate)",
    ):
        assert want in titles


# ---- PrometheusRule ------------------------------------------------------------------------

ALERTS = {
    "DelaySidecarEarlyDelivery",
    "DelaySidecarLatenessHigh",
    "DelaySidecarDeadLetterRate",
    "DelaySidecarConsumerLagGrowing",
    "DelaySidecarNotReady",
    "DelaySidecarIngressPaused",
    "DelaySidecarDiskFilling",
    "DelaySidecarChangelogWritesRefused",
}


def rules(docs: list[Doc]) -> dict[str, Doc]:
    (group,) = only(docs, "PrometheusRule")["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


@pytest.fixture(scope="module")
def rule_docs(helm: str) -> list[Doc]:
    return render(helm, sets=MONITORING_ON)


def test_prometheus_rule_only_when_enabled(default_docs: list[Doc], rule_docs: list[Doc]) -> None:
    assert not [d for d in default_docs if d["kind"] == "PrometheusRule"]
    assert set(rules(rule_docs)) == ALERTS


def test_alert_expressions_name_only_series_the_sidecar_renders(rule_docs: list[Doc], helm: str) -> None:
    series = exposed_series()
    for docs in (rule_docs, render(helm, CI_MONITORING)):
        for name, rule in rules(docs).items():
            assert check_promql(rule["expr"], series) == [], name
            for vs in selectors(parse_promql(rule["expr"])):
                matchers = {(m.name, m.value) for m in vs.matchers.matchers}
                assert {("job", f"{FULLNAME}-metrics"), ("namespace", "delay")} <= matchers, (name, vs.name)


def test_alerts_select_the_series_the_service_monitor_scrapes(rule_docs: list[Doc]) -> None:
    """The default selector is the job and namespace the ServiceMonitor's targets get: the
    operator names the job after the scraped Service."""
    sm = only(rule_docs, "ServiceMonitor")
    svc = only(rule_docs, "Service", f"{FULLNAME}-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert (
        f'job="{svc["metadata"]["name"]}", namespace="{svc["metadata"]["namespace"]}"'
        in (rules(rule_docs)["DelaySidecarNotReady"]["expr"])
    )


def test_alert_thresholds_and_labels_come_from_values(helm: str) -> None:
    r = rules(render(helm, CI_MONITORING))
    assert r["DelaySidecarLatenessHigh"]["expr"].split()[-1] == "0.25"
    assert r["DelaySidecarLatenessHigh"]["for"] == "5m"
    assert r["DelaySidecarDeadLetterRate"]["expr"].split()[-1] == "0.5"
    assert "> 50000" in r["DelaySidecarConsumerLagGrowing"]["expr"]
    for rule in r.values():
        assert rule["labels"]["team"] == "messaging"
    assert r["DelaySidecarEarlyDelivery"]["labels"]["severity"] == "critical"
    # emptyDir bounded by config.diskMaxBytes: 2GiB
    assert r["DelaySidecarDiskFilling"]["expr"].endswith(f"/ {2 * 1024**3} > 0.9")

    r = rules(
        render(
            helm,
            sets=(
                *MONITORING_ON,
                "metrics.prometheusRule.alerts.notReady.enabled=false",
                'metrics.prometheusRule.selector=service="x"',
            ),
        )
    )
    assert "DelaySidecarNotReady" not in r
    assert 'delay_sidecar_ingress_paused{service="x"} == 1' in r["DelaySidecarIngressPaused"]["expr"]


@pytest.mark.parametrize(
    ("sets", "capacity"),
    [
        ((), 10 * 1024**3),  # persistence.size 10Gi
        (("persistence.size=1.5Ti",), int(1.5 * 1024**4)),
        (("persistence.size=500G",), 500 * 1000**3),
        (("config.diskMaxBytes=64MiB",), 64 * 1024**2),  # below the volume: the sidecar pauses there
        (("config.diskMaxBytes=20GB",), 10 * 1024**3),  # above the volume: the volume is the limit
        (("config.diskMaxBytes=1000000000", "persistence.enabled=false"), 10**9),
        (("persistence.enabled=false",), None),  # emptyDir, no limit: nothing to compare with
    ],
)
def test_disk_alert_compares_with_the_store_limit(helm: str, sets: tuple[str, ...], capacity: int | None) -> None:
    r = rules(render(helm, sets=(*MONITORING_ON, *sets)))
    if capacity is None:
        assert "DelaySidecarDiskFilling" not in r
        return
    m = re.search(r"delay_sidecar_store_bytes\{[^}]*\} / (\d+) > 0.8$", r["DelaySidecarDiskFilling"]["expr"])
    assert m, r["DelaySidecarDiskFilling"]["expr"]
    assert int(m.group(1)) == capacity


@pytest.mark.parametrize(
    ("values_text", "rendered"),
    [("", True), ("config:\n  changelog: off\n", False), ("config:\n  changelog: 'off'\n", False),
     ("metrics:\n  prometheusRule:\n    alerts:\n      changelogWritesRefused:\n        enabled: false\n", False)],
)
def test_changelog_alert_only_with_the_changelog(helm: str, tmp_path: Path, values_text: str, rendered: bool) -> None:
    """Refused changelog writes for 2 minutes alert per partition; with the changelog off there is
    nothing to refuse and no alert."""
    vfile = tmp_path / "v.yaml"
    vfile.write_text(values_text)
    r = rules(render(helm, vfile, sets=MONITORING_ON))
    assert ("DelaySidecarChangelogWritesRefused" in r) == rendered
    if rendered:
        rule = r["DelaySidecarChangelogWritesRefused"]
        assert rule["expr"] == (
            f'delay_sidecar_changelog_refused_writes{{job="{FULLNAME}-metrics", namespace="delay"}} > 0'
        )
        assert rule["for"] == "2m" and rule["labels"]["severity"] == "critical"
        assert "$labels.partition" in rule["annotations"]["description"]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook_in_docs_helm_md(rule_docs: list[Doc]) -> None:
    text = HELM_DOC.read_text()
    section = text.split("## Alerts and runbooks", 1)[1].split("\n## ", 1)[0]
    runbooks = re.findall(r"^### (\S+)\n", section, re.M)
    assert sorted(runbooks) == sorted(ALERTS)
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    base = "https://github.com/kafka-delay-sidecar/kafka-delay-sidecar/blob/main/docs/helm.md#"
    for name, rule in rules(rule_docs).items():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(base), url
        assert url.removeprefix(base) in anchors and url.removeprefix(base) == github_anchor(name)
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        for body in section.split("\n### ")[1:]:
            if body.startswith(name):
                assert "**What it means**" in body and "**What to do**" in body, name


# ---- the KafkaUser (kafkaUser.enabled) -----------------------------------------------------------


def _acl_rows(entries: list[Doc]) -> set[tuple[str, str, str, str]]:
    return {(e["resource"]["type"], e["resource"].get("name", ""), e["resource"].get("patternType", ""), op)
            for e in entries for op in e["operations"]}


@pytest.mark.parametrize("values_text", [
    "kafkaUser: {enabled: true, targets: [orders.paid]}",
    "config: {delivery: exactly-once, historyTopic: delay.history, changelogTopic: cl, groupId: g}\n"
    "kafkaUser: {enabled: true, targetPrefixes: [orders.], targets: [payments], createTopics: true, name: sc}",
    "config: {changelog: 'off', ingressTopic: in, dlqTopic: dead}\nkafkaUser: {enabled: true, targets: [t]}",
], ids=["defaults", "exactly-once-history-create", "changelog-off"])
def test_kafka_user_holds_the_acls_delay_sidecar_acls_prints(helm: str, tmp_path: Path, values_text: str) -> None:
    from sidecar import acls

    values = tmp_path / "values.yaml"
    values.write_text(values_text)
    docs = render(helm, values)
    user = only(docs, "KafkaUser")
    ku = yaml.safe_load(values_text)["kafkaUser"]
    targets = [acls.Target(t) for t in ku.get("targets", [])]
    targets += [acls.Target(t, acls.PREFIXED) for t in ku.get("targetPrefixes", [])]
    s = settings_in_pod(docs, tmp_path, {})
    name = ku.get("name", FULLNAME)
    want = acls.kafka_user(acls.acls_for("run", s, targets, create_topics=ku.get("createTopics", False)), name,
                           "my-cluster")
    assert user["apiVersion"] == want["apiVersion"] and user["metadata"]["name"] == name
    assert user["metadata"]["labels"]["strimzi.io/cluster"] == "my-cluster"
    assert user["spec"]["authentication"] == want["spec"]["authentication"]
    assert _acl_rows(user["spec"]["authorization"]["acls"]) == _acl_rows(want["spec"]["authorization"]["acls"])


def test_kafka_user_is_off_by_default_and_needs_targets(default_docs: list[Doc], helm: str) -> None:
    assert not [d for d in default_docs if d["kind"] == "KafkaUser"]
    assert "kafkaUser.targets or kafkaUser.targetPrefixes" in render_error(helm, "kafkaUser.enabled=true")


# ---- tenants -------------------------------------------------------------------------------


def test_tenants_render_the_config_and_project_each_tenants_secret(helm: str, tmp_path: Path) -> None:
    docs = render(helm, CI_TENANTS)
    doc = config_doc(docs)
    assert "ingress-topic" not in doc  # each tenant names its own
    creds = "/etc/delay-sidecar/tenants/payments"
    assert doc["tenants"] == {
        "payments": {
            "ingress-topic": "payments.delay", "dlq-topic": "payments.delay.dlq",
            "target-allowlist": [r"payments\..*"], "max-delay": "7d",
            "kafka": {"sasl.username": {"file": f"{creds}/username"}, "sasl.password": {"file": f"{creds}/password"}},
        },
        "search": {"ingress-topic": "search.delay", "changelog-topic": "search.delay.cl"},
    }
    # the files the config names are the Secret's keys, projected into the config volume
    pod = only(docs, "StatefulSet")["spec"]["template"]["spec"]
    mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/delay-sidecar" and mount["readOnly"] is True
    sources = next(v for v in pod["volumes"] if v["name"] == "config")["projected"]["sources"]
    assert sources[0] == {"configMap": {"name": FULLNAME}}
    [secret] = [s["secret"] for s in sources[1:]]
    assert secret["name"] == "payments-kafka"
    files = {f"{mount['mountPath']}/{i['path']}": i["key"] for i in secret["items"]}
    assert files == {f"{creds}/username": "user", f"{creds}/password": "pass"}
    assert all(i["mode"] & 0o007 == 0 for i in secret["items"])  # not world-readable
    assert "payments-kafka" not in config_text(docs)  # no secret, nor its name, in the ConfigMap

    # the sidecar's own loader reads the file as the pod would: the Secret's values projected where
    # the config points (here under tmp_path, as the kubelet does under the mount path)
    secret_data = {"user": "svc-payments", "pass": "p4ss\n"}  # a trailing newline is stripped
    for path, key in files.items():
        local = tmp_path / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(secret_data[key])
    for prop in doc["tenants"]["payments"]["kafka"].values():
        prop["file"] = str(tmp_path / prop["file"].lstrip("/"))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    s = load_settings(config_file=cfg, environ={"DELAY_SIDECAR_KAFKA_SASL_USERNAME": "svc",
                                               "DELAY_SIDECAR_KAFKA_SASL_PASSWORD": "pw"})
    assert [(t.name, t.ingress_topic, t.dlq_topic, t.target_allowlist, t.max_delay_ms, t.changelog_topic)
            for t in s.tenants] == [
        ("payments", "payments.delay", "payments.delay.dlq", (r"payments\..*",), 7 * 86_400_000,
         "payments.delay.changelog"),
        ("search", "search.delay", "shared.delay.dlq", s.target_allowlist, s.max_delay_ms, "search.delay.cl"),
    ]
    assert dict(s.tenants[0].kafka) == {"sasl.username": "svc-payments", "sasl.password": "p4ss"}
    assert s.tenants[1].kafka == ()  # the deployment's principal


def test_without_tenants_the_config_volume_is_the_configmap_alone(helm: str) -> None:
    docs = render(helm, sets=("tenants.a.ingressTopic=a.in",))
    assert config_doc(docs)["tenants"] == {"a": {"ingress-topic": "a.in"}}
    pod = only(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "config") == {"name": "config",
                                                                        "configMap": {"name": FULLNAME}}


@pytest.mark.parametrize(("sets", "needle"), [
    (("tenants.a.ingressTopic=a.in", "config.changelogTopic=x.cl"),
     "config.changelogTopic is set and tenants are given"),
    (("tenants.a.dlqTopic=a.dlq",), "missing property 'ingressTopic'"),
    (("tenants.a\\.b/c.ingressTopic=a.in",), "invalid propertyName 'a.b/c'"),  # not a tenant name
    (("tenants.a.ingressTopic=a.in", "tenants.a.credentials.usernameKey=u"), "missing property 'existingSecret'"),
    (("tenants.a.ingressTopic=a.in", "tenants.a.quota=1"), "additional properties 'quota' not allowed"),
])
def test_bad_tenants_are_refused(helm: str, sets: tuple[str, ...], needle: str) -> None:
    assert needle in render_error(helm, *sets)
