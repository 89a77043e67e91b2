"""What OpenSSL says of a broker's certificate, when librdkafka only says it failed.

librdkafka reports most certificate failures as ``certificate verify failed``, which
``kafka_errors`` reads as an unknown CA. ``tls_reason`` makes one TLS handshake with Python's
``ssl`` to the first bootstrap server, with the CA file and host-name check of the client
properties, and returns OpenSSL's verify message (``certificate has expired``, ``Hostname
mismatch``, ...), so the start-up probe (``connectivity``) and the run-time refusals
(``engine/refusals.py``) can name the cause. Below both, since both need it.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from sidecar import kafka_errors as ke
from sidecar.kafka_errors import Cause


def vague_tls(cause: Cause) -> bool:
    """A TLS failure librdkafka named only as ``certificate verify failed`` (read as an unknown
    CA): :func:`tls_reason` can tell which."""
    return cause.code == ke.TLS_FAILED and cause.reason in ("", "unknown-ca")


def tls_reason(conf: dict[str, Any], timeout_s: float = 2.0) -> str:
    """OpenSSL's verify message for the first bootstrap server's certificate with the CA file and
    host name check of ``conf`` (librdkafka's defaults: the system CAs, host names checked), or
    "" when the handshake succeeds or fails for another reason."""
    first = str(conf.get("bootstrap.servers", "")).split(",")[0].strip()
    host, _, port = first.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return ""
    ctx = ssl.create_default_context(cafile=conf.get("ssl.ca.location") or None)
    ctx.check_hostname = str(conf.get("ssl.endpoint.identification.algorithm", "https")).lower() == "https"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock, \
                ctx.wrap_socket(sock, server_hostname=host):
            return ""
    except ssl.SSLCertVerificationError as e:
        return str(e.verify_message or e.reason or e)
    except (OSError, ValueError):
        return ""
