"""The secured variant of the dev broker: SASL_SSL (SCRAM-SHA-512), TLS and ACLs.

What ``LocalKafka(secure=...)`` adds to the plain broker (devkafka/local.py), made of three parts
kept here so that local.py only asks for them:

* **Certificates**, made once per data directory with ``openssl`` (present wherever a TLS stack
  is, faster than a JVM per ``keytool`` step): a self-signed CA and a broker certificate it signs
  for ``localhost`` and ``127.0.0.1`` (clients check the host name: librdkafka's
  ``ssl.endpoint.identification.algorithm`` defaults to ``https``). The broker reads a PKCS#12
  keystore; clients read ``<data_dir>/tls/ca.pem`` (``ssl.ca.location``). A restart on the same
  data directory keeps them, so a client's CA file stays valid.
* **Users**: SCRAM-SHA-512 credentials written into the metadata log by ``kafka-storage format
  --add-scram`` (SCRAM users live in KRaft metadata, and a broker that has not started yet can
  only be given them there). ``admin`` is always one of them and is a super user; the broker's
  inter-broker connections (the transaction coordinator writes its markers through them, to
  itself) use it too. Passwords are random unless given, kept in ``<data_dir>/tls/users.json``
  (mode 0600) so that a restart matches what was formatted. :func:`add_user` adds one later, as
  the admin, through the Admin API (tests make a principal per test that way).
* **Authorization**: the StandardAuthorizer with ``allow.everyone.if.no.acl.found=false``: a
  principal may do only what an ACL allows. The CONTROLLER listener stays PLAINTEXT on
  127.0.0.1 and its principal (``User:ANONYMOUS``) is a super user, because the broker half of
  this combined node registers with the controller half through it (CLUSTER_ACTION). That is a
  development shortcut: anything on this machine that speaks the controller protocol to that
  port is trusted. Never a production layout.
* **An expired certificate**, on request (``SecureBroker(expired_listener=True)``): a second
  SASL_SSL listener, ``EXPIRED``, whose certificate (same name, same CA) ended yesterday, made
  with ``openssl ca`` (``-startdate``/``-enddate``: ``openssl x509 -req`` sets only a number of
  days from now before OpenSSL 3.4). Kafka refuses to start an inter-broker listener with an
  expired certificate (it shakes hands with itself to validate its keystore), so the expired one
  is on a client-only listener and the inter-broker one keeps the valid certificate.
  :func:`renew_expired_listener` replaces it with the valid one while the broker runs, through a
  dynamic broker config (the broker re-reads the keystore of a listener whose location changed),
  and :func:`expire_listener_again` puts the expired one back.

Client settings (librdkafka names) come from :meth:`SecureBroker.client_config`;
``delay-sidecar dev-kafka --secure`` prints them.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ADMIN",
    "EXPIRED_LISTENER",
    "MECHANISM",
    "SecureBroker",
    "SecureBrokerError",
    "acl_binding",
    "add_user",
    "expire_listener_again",
    "renew_expired_listener",
]

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
EXPIRED_LISTENER = "EXPIRED"
_OPENSSL_TIMEOUT_S = 60.0
# SCRAM's format-time syntax (``[name=x,password=y]``) has no escaping: names and passwords
# are kept to characters that cannot break it.
_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class SecureBrokerError(RuntimeError):
    """The certificates or credentials of the secured broker could not be made."""


@dataclass
class SecureBroker:
    """Certificates, users and the broker/client properties of one secured data directory."""

    users: Mapping[str, str | None] = field(default_factory=dict)
    """Named users besides ``admin`` (name -> password; None: a random one)."""
    tls_dir: Path | None = None
    passwords: dict[str, str] = field(default_factory=dict)
    keystore_password: str = ""
    expired_listener: bool = False
    """Also a client listener ``EXPIRED`` presenting a certificate that expired yesterday."""
    expired_port: int = 0
    """Its port (0: a free one, picked at the first start and kept)."""

    def __post_init__(self) -> None:
        for name in self.users:
            _check_word("user name", name)

    @property
    def ca_path(self) -> Path:
        """The CA certificate clients trust (``ssl.ca.location``)."""
        if self.tls_dir is None:
            raise SecureBrokerError("secured broker not prepared yet (start it first)")
        return self.tls_dir / "ca.pem"

    def prepare(self, data_dir: Path) -> None:
        """Make (or reuse) the certificates and the credentials under ``data_dir/tls``."""
        tls = data_dir / "tls"
        tls.mkdir(parents=True, exist_ok=True)
        os.chmod(tls, 0o700)
        self.tls_dir = tls
        saved = tls / "users.json"
        stored: dict[str, str] = json.loads(saved.read_text()) if saved.is_file() else {}
        wanted = {ADMIN: None, **dict(self.users)}
        for name, password in wanted.items():
            _check_word("user name", name)
            pw = password or stored.get(name) or secrets.token_hex(12)
            _check_word(f"password of {name}", pw)
            self.passwords[name] = pw
        self.keystore_password = stored.get(".keystore") or secrets.token_hex(12)
        fd = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({**stored, **self.passwords, ".keystore": self.keystore_password}, fh)
        if not (tls / "broker.p12").is_file() or not self.ca_path.is_file():
            _make_certificates(tls, self.keystore_password)
        if self.expired_listener:
            if not (tls / "expired.p12").is_file():
                _make_expired_certificate(tls, self.keystore_password)
            if self.expired_port == 0:
                self.expired_port = _free_port()

    @property
    def expired_bootstrap(self) -> str:
        """``bootstrap.servers`` of the listener with the expired certificate."""
        if not self.expired_listener or self.expired_port == 0:
            raise SecureBrokerError("no expired listener: SecureBroker(expired_listener=True), started")
        return f"127.0.0.1:{self.expired_port}"

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments that create every user's SCRAM credential."""
        out: list[str] = []
        for name, pw in self.passwords.items():
            out += ["--add-scram", f"{MECHANISM}=[name={name},password={pw}]"]
        return out

    def broker_properties(self, port: int, controller_port: int) -> dict[str, str]:
        """Listeners, TLS, SASL and the authorizer; they replace the plain broker's listeners."""
        tls = self.ca_path.parent
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}" '
                f'password="{self.passwords[ADMIN]}";')
        expired: dict[str, str] = {}
        listener, advertised, protocols = f"SASL_SSL://127.0.0.1:{port}", "", "SASL_SSL:SASL_SSL"
        if self.expired_listener:
            name = EXPIRED_LISTENER.lower()
            advertised = f",{EXPIRED_LISTENER}://127.0.0.1:{self.expired_port}"
            protocols += f",{EXPIRED_LISTENER}:SASL_SSL"
            expired = {f"listener.name.{name}.{MECHANISM.lower()}.sasl.jaas.config": jaas,
                       f"listener.name.{name}.ssl.keystore.location": str(tls / "expired.p12")}
        return {
            "listeners": f"{listener}{advertised},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"{listener}{advertised}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": f"{protocols},CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            **expired,
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(tls / "broker.p12"),
            "ssl.keystore.password": self.keystore_password,
            "ssl.key.password": self.keystore_password,
            # the inter-broker client side (transaction markers to itself) trusts our CA
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_path),
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN};User:ANONYMOUS",
        }

    def client_config(self, user: str = ADMIN, password: str | None = None) -> dict[str, str]:
        """librdkafka properties for ``user`` (a format-time user, or ``password`` given)."""
        pw = password if password is not None else self.passwords.get(user)
        if pw is None:
            raise SecureBrokerError(f"unknown user {user!r}: one of {', '.join(self.passwords)}, or give its password")
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": MECHANISM,
            "sasl.username": user,
            "sasl.password": pw,
            "ssl.ca.location": str(self.ca_path),
        }

    def describe_users(self) -> str:
        """One line per user: the ``--kafka`` flags of ``delay-sidecar`` commands that log in as it."""
        lines = []
        for name in self.passwords:
            flags = " ".join(f"--kafka {k}={v}" for k, v in self.client_config(name).items())
            lines.append(f"user {name}{' (super user)' if name == ADMIN else ''}: {flags}")
        return "\n".join(lines)


def add_user(admin: Any, name: str, password: str, timeout: float = 30) -> None:
    """Create (or change) ``name``'s SCRAM-SHA-512 credential through ``admin`` (an AdminClient
    connected as a super user)."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    _check_word("user name", name)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    upsert = UserScramCredentialUpsertion(name, info, password.encode())
    for fut in admin.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
        fut.result()


def renew_expired_listener(admin: Any, secure: SecureBroker, node_id: int = 1, timeout: float = 30) -> None:
    """Give the ``EXPIRED`` listener the valid broker certificate while the broker runs, as an
    operator renews one: a per-broker dynamic config (``kafka-configs --alter --entity-type
    brokers --entity-name <node_id> --add-config listener.name.expired.ssl.keystore.location=...``)
    through ``admin`` (a super user's AdminClient on the valid listener). Same name and
    subject alternative names, so the broker accepts it; new connections get it."""
    _set_expired_keystore(admin, secure.ca_path.parent / "broker.p12", node_id, timeout)


def expire_listener_again(admin: Any, secure: SecureBroker, node_id: int = 1, timeout: float = 30) -> None:
    """Undo :func:`renew_expired_listener`: the ``EXPIRED`` listener presents the expired
    certificate again to new connections."""
    _set_expired_keystore(admin, secure.ca_path.parent / "expired.p12", node_id, timeout)


def _set_expired_keystore(admin: Any, keystore: Path, node_id: int, timeout: float) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entry = ConfigEntry(f"listener.name.{EXPIRED_LISTENER.lower()}.ssl.keystore.location", str(keystore),
                        incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.BROKER, str(node_id), incremental_configs=[entry])
    for fut in admin.incremental_alter_configs([resource], request_timeout=timeout).values():
        fut.result()


def acl_binding(principal: str, resource: str, name: str, pattern: str, operation: str) -> Any:
    """A confluent_kafka ``AclBinding`` that ALLOWs ``operation`` (``WRITE``, ``READ``...) on
    the ``resource`` (``TOPIC``, ``GROUP``, ``TRANSACTIONAL_ID``, ``CLUSTER``) called ``name``,
    matched ``pattern`` (``LITERAL`` or ``PREFIXED``), from any host."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return AclBinding(ResourceType[resource], name, ResourcePatternType[pattern], principal, "*",
                      AclOperation[operation], AclPermissionType.ALLOW)


def _check_word(what: str, word: str) -> None:
    if not word or not set(word) <= _SAFE:
        raise SecureBrokerError(f"{what} {word!r}: use letters, digits, '-', '_' and '.' only")


def _make_certificates(tls: Path, password: str) -> None:
    """CA + broker certificate (P-256 keys, valid a year) and the broker's PKCS#12 keystore."""
    ext = tls / "broker.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
                   "basicConstraints=CA:FALSE\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl(tls, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "365",
             "-subj", "/CN=kafka-delay-sidecar dev CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl(tls, "req", *ec, "-keyout", "broker.key", "-out", "broker.csr", "-subj", "/CN=localhost")
    _openssl(tls, "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "broker.pem", "-days", "365", "-extfile", ext.name)
    _openssl(tls, "pkcs12", "-export", "-inkey", "broker.key", "-in", "broker.pem", "-certfile", "ca.pem",
             "-name", "broker", "-out", "broker.p12", "-passout", f"pass:{password}")
    for key in ("ca.key", "broker.key"):
        os.chmod(tls / key, 0o600)


def _make_expired_certificate(tls: Path, password: str) -> None:
    """A broker certificate like broker.pem (same key, name and CA) valid for 30 days up to
    yesterday, and its keystore expired.p12 (same password as broker.p12: a dynamic keystore
    change may then name only the location)."""
    now = datetime.datetime.now(datetime.UTC)
    stamp = "%Y%m%d%H%M%SZ"
    (tls / "expired.cnf").write_text(
        "[ca]\ndefault_ca = dev\n[dev]\ndatabase = expired.index\nnew_certs_dir = .\nserial = expired.srl\n"
        "default_md = sha256\npolicy = any\nunique_subject = no\n[any]\ncommonName = supplied\n")
    (tls / "expired.index").write_text("")
    (tls / "expired.srl").write_text(secrets.token_hex(8) + "\n")
    _openssl(tls, "ca", "-batch", "-notext", "-config", "expired.cnf", "-cert", "ca.pem", "-keyfile", "ca.key",
             "-in", "broker.csr", "-out", "expired.pem", "-extfile", "broker.ext",
             "-startdate", (now - datetime.timedelta(days=31)).strftime(stamp),
             "-enddate", (now - datetime.timedelta(days=1)).strftime(stamp))
    _openssl(tls, "pkcs12", "-export", "-inkey", "broker.key", "-in", "expired.pem", "-certfile", "ca.pem",
             "-name", "broker", "-out", "expired.p12", "-passout", f"pass:{password}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(cwd: Path, *args: str) -> None:
    try:
        proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=_OPENSSL_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SecureBrokerError("openssl is not installed: it makes the secured broker's certificates") from None
    except subprocess.TimeoutExpired:
        raise SecureBrokerError(f"openssl {args[0]} timed out") from None
    if proc.returncode != 0:
        raise SecureBrokerError(f"openssl {args[0]} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")

