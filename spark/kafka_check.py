"""Checking the accuracy job's Kafka before Spark starts, with librdkafka.

``delay-sidecar accuracy`` passes its ``--kafka`` properties to Spark's Kafka source: Java client
names. A wrong password or an unreachable broker there shows only as a Java stack trace from an
executor, after the session started. So the job first runs the same check as the other commands
(:func:`sidecar.connectivity.probe`) with the Java properties translated to librdkafka's where
they have a counterpart: ``security.protocol``, ``sasl.mechanism``, the ``username`` and
``password`` of a ``sasl.jaas.config`` (the Plain and SCRAM login modules), a PEM truststore
(``ssl.ca.location``) and the host name check. A truststore librdkafka cannot read (JKS, PKCS12:
the Java client's default type is JKS) is listed by the JDK's ``keytool -list -rfc`` (Java is
there: Spark needs it) and its certificates written as a PEM file in ``pem_dir`` for the probe,
so a truststore without the broker's CA fails here, as it would in Spark. Without ``pem_dir``,
or when keytool is missing or cannot read the store (Spark will say why), the probe's
certificate verification is off: reachability and credentials are still checked. Properties
without a counterpart are left out of the probe.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

_JAAS_FIELD = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def truststore_pem(location: str, store_type: str, password: str | None, pem_dir: Path) -> str | None:
    """The certificates of a JKS or PKCS12 truststore as a PEM file in ``pem_dir`` (its path), or
    None when keytool is missing or cannot list the store."""
    home = os.environ.get("JAVA_HOME")
    keytool = shutil.which("keytool") or (str(Path(home) / "bin" / "keytool") if home else None)
    if keytool is None or not Path(keytool).exists():
        return None
    cmd = [keytool, "-list", "-rfc", "-keystore", location, "-storetype", store_type]
    # without a password keytool asks for one on stdin: an empty line lists a JKS store unverified
    cmd += ["-storepass", password] if password else []
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    certs = _PEM.findall(out.stdout)
    if out.returncode != 0 or not certs:
        return None
    pem = pem_dir / "truststore.pem"
    pem.write_text("\n".join(certs) + "\n")
    return str(pem)


def librdkafka_conf(bootstrap: str, java: Mapping[str, str], pem_dir: Path | None = None) -> dict[str, str]:
    """librdkafka properties for the probe, from Spark's Kafka options (``kafka.`` prefix or not);
    ``pem_dir``: where a JKS or PKCS12 truststore's certificates may be written as PEM."""
    props = {k.removeprefix("kafka."): v for k, v in java.items()}
    conf = {"bootstrap.servers": bootstrap}
    for key in ("security.protocol", "sasl.mechanism"):
        if key in props:
            conf[key] = props[key]
    for name, value in _JAAS_FIELD.findall(props.get("sasl.jaas.config", "")):
        conf[f"sasl.{name}"] = value.replace('\\"', '"')
    if "ssl.truststore.location" in props:
        store_type = props.get("ssl.truststore.type", "JKS").upper()
        pem = (props["ssl.truststore.location"] if store_type == "PEM" else
               truststore_pem(props["ssl.truststore.location"], store_type, props.get("ssl.truststore.password"),
                              pem_dir) if pem_dir is not None else None)
        if pem is not None:
            conf["ssl.ca.location"] = pem
        else:
            conf["enable.ssl.certificate.verification"] = "false"
    if "ssl.endpoint.identification.algorithm" in props:
        conf["ssl.endpoint.identification.algorithm"] = props["ssl.endpoint.identification.algorithm"] or "none"
    return conf
