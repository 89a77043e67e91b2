"""The Helm chart (helm/kafka-delay-sidecar), rendered with the real ``helm`` binary.

``helm`` comes from PATH or ``$KDS_CACHE/bin`` (scripts/setup.d/30-helm.sh builds it there). Without
it these tests skip, except under ``CI=true`` where a missing helm is a failure.

The rendered config file is fed through ``sidecar.config.load_settings`` with the pod's environment,
so the chart is checked against the sidecar's own option table, not against a copy of it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import OPTIONS, Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "kafka-delay-sidecar"
CI_TLS_SASL = CHART / "ci" / "tls-sasl-values.yaml"
CI_THREE = CHART / "ci" / "three-replicas-values.yaml"
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
        msg = "helm not found on PATH or in $KDS_CACHE/bin (run scripts/setup.d/30-helm.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def _run(helm: str, *args: str, chart: Path = CHART) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, *args[:1], RELEASE, str(chart), "--namespace", "delay", *args[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def render(helm: str, *values: Path, sets: tuple[str, ...] = (), chart: Path = CHART) -> list[Doc]:
    args = ["template"]
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


@pytest.mark.parametrize("values", [None, CI_TLS_SASL, CI_THREE], ids=["defaults", "tls-sasl", "three"])
def test_helm_lint_strict(helm: str, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_values_files_are_the_ones_ci_lints() -> None:
    assert sorted(p.name for p in (CHART / "ci").glob("*.yaml")) == sorted([CI_TLS_SASL.name, CI_THREE.name])


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
    assert set(doc) - {"kafka"} == {o.name for o in OPTIONS} - {"group-instance-id"}
    s = settings_in_pod(docs, tmp_path, {})
    expected = Settings(
        bootstrap_servers="broker:9092",
        data_dir=DATA_DIR,
        http_port=8080,
        group_instance_id=f"{FULLNAME}-0",
        kafka={"session.timeout.ms": "45000"},
    )
    assert s == expected


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
    assert "placeholder" not in notes
    defaults = only(render(helm, chart=chart), "ConfigMap", "rendered-notes")["data"]["notes"]
    assert "placeholder" in defaults  # warns while bootstrapServers is the default
