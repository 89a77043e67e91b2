"""Checking the accuracy job's Kafka before Spark starts, with librdkafka.

``delay-sidecar accuracy`` passes its ``--kafka`` properties to Spark's Kafka source: Java client
names. A wrong password or an unreachable broker there shows only as a Java stack trace from an
executor, after the session started. So the job first runs the same check as the other commands
(:func:`sidecar.connectivity.probe`) with the Java properties translated to librdkafka's where
they have a counterpart: ``security.protocol``, ``sasl.mechanism``, the ``username`` and
``password`` of a ``sasl.jaas.config`` (the Plain and SCRAM login modules), a PEM truststore
(``ssl.ca.location``) and the host name check. A truststore librdkafka cannot read (JKS, PKCS12)
turns the probe's certificate verification off: reachability and credentials are still checked,
the TLS trust is left to Spark. Properties without a counterpart are left out of the probe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_JAAS_FIELD = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


def librdkafka_conf(bootstrap: str, java: Mapping[str, str]) -> dict[str, str]:
    """librdkafka properties for the probe, from Spark's Kafka options (``kafka.`` prefix or not)."""
    props = {k.removeprefix("kafka."): v for k, v in java.items()}
    conf = {"bootstrap.servers": bootstrap}
    for key in ("security.protocol", "sasl.mechanism"):
        if key in props:
            conf[key] = props[key]
    for name, value in _JAAS_FIELD.findall(props.get("sasl.jaas.config", "")):
        conf[f"sasl.{name}"] = value.replace('\\"', '"')
    if "ssl.truststore.location" in props:
        if props.get("ssl.truststore.type", "JKS").upper() == "PEM":
            conf["ssl.ca.location"] = props["ssl.truststore.location"]
        else:
            conf["enable.ssl.certificate.verification"] = "false"
    if "ssl.endpoint.identification.algorithm" in props:
        conf["ssl.endpoint.identification.algorithm"] = props["ssl.endpoint.identification.algorithm"] or "none"
    return conf
