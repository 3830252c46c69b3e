"""Apache Kafka with TLS, SASL/SCRAM-SHA-512, one principal per service and ACLs: `periscope up
--broker kafka --secure` and the ACL tests.

Everything is Kafka's own: the client listener speaks SASL_SSL (no proxy), the broker authenticates
itself to its own listener with a SCRAM user of its own (a super user), the controller listener (on
loopback) takes SASL/PLAIN from that same user only, and the standard authorizer decides with the
grants of periscope.bus.acls. SCRAM credentials are written when the storage is formatted; the ACLs
are created over the wire (CreateAcls, version 2) once the broker is up. `credentials()` writes a
directory with `ca.crt` and one `<service>.env` per principal holding its PERISCOPE_KAFKA_* settings.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from pathlib import Path

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import CompactArray, CompactString, Int8, Int16, Int32, Schema, TaggedFields
from cryptography.hazmat.primitives import serialization

from periscope.bus.acls import SERVICES, Acl, service_acls
from periscope.bus.clients import Kafka
from periscope.bus.profile import KAFKA
from periscope.bus.security import KafkaSecurity, Mechanism
from periscope.devkit.apache_kafka import ApacheKafka
from periscope.devkit.embedded import BrokerError
from periscope.devkit.secure_broker import make_certificates

MECHANISM: Mechanism = "SCRAM-SHA-512"
BROKER_USER = "periscope-broker"


def principal(service: str) -> str:
    return f"periscope-{service}"


# ------------------------------------------------------------------ CreateAcls v2 (flexible)

_RESOURCE = {"topic": 2, "group": 3, "cluster": 4}
_PATTERN = {"literal": 3, "prefixed": 4}
_OPERATION = {"All": 2, "Read": 3, "Write": 4, "Create": 5, "Describe": 8, "DescribeConfigs": 10,
              "AlterConfigs": 11}
_ALLOW = 3
_Creation = tuple[int, str, int, str, str, int, int, dict[int, bytes]]


class _CreateAclsResponseV2(Response):
    API_KEY = 30
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("results", CompactArray(("error_code", Int16), ("error_message", CompactString("utf-8")),
                                 ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _CreateAclsRequestV2(RequestStruct):
    # Kafka 4 serves CreateAcls from version 2 (KIP-896); aiokafka knows only versions 0 and 1.
    FLEXIBLE_VERSION = True
    API_KEY = 30
    API_VERSION = 2
    RESPONSE_TYPE = _CreateAclsResponseV2
    SCHEMA = Schema(
        ("creations", CompactArray(
            ("resource_type", Int8), ("resource_name", CompactString("utf-8")),
            ("resource_pattern_type", Int8), ("principal", CompactString("utf-8")),
            ("host", CompactString("utf-8")), ("operation", Int8), ("permission_type", Int8),
            ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _CreateAcls(Request[_CreateAclsRequestV2]):
    API_KEY = 30

    def __init__(self, creations: list[_Creation]) -> None:
        self._creations = creations

    def build(self, request_struct_class: type[_CreateAclsRequestV2]) -> _CreateAclsRequestV2:
        return request_struct_class(self._creations, {})


def _creations(user: str, acls: tuple[Acl, ...]) -> list[_Creation]:
    return [(_RESOURCE[a.resource], a.name if a.resource != "cluster" else "kafka-cluster",
             _PATTERN[a.pattern], f"User:{user}", "*", _OPERATION[op], _ALLOW, {})
            for a in acls for op in a.operations]


async def create_acls(kafka: Kafka, grants: dict[str, tuple[Acl, ...]]) -> int:
    """Create every grant (user -> ACLs) with a super user's connection; returns how many were made."""
    creations = [c for user, acls in grants.items() for c in _creations(user, acls)]
    admin = kafka.admin("periscope-acls")
    await admin.start()
    try:
        response = await admin._send_request(_CreateAcls(creations))
    finally:
        await admin.close()
    failed = [(code, msg) for code, msg, _ in response.results if code]
    if failed:
        raise BrokerError(f"creating ACLs failed: error {failed[0][0]} {failed[0][1]}")
    return len(creations)


# ------------------------------------------------------------------ the broker


@dataclass(frozen=True, slots=True)
class Principal:
    service: str
    username: str
    password: str


class SecureKafka:
    """An ApacheKafka whose only client listener is SASL_SSL, with a SCRAM user per service."""

    profile = "kafka"

    def __init__(self, directory: Path, port: int = 0, *, joiner_app_id: str = "periscope-joiner") -> None:
        self.directory = directory
        tls = directory / "tls"
        self.files = make_certificates(tls)
        keystore = tls / "broker-keystore.pem"  # Kafka's PEM keystore: a PKCS#8 key and its chain
        key = serialization.load_pem_private_key(self.files.server_key.read_bytes(), password=None)
        keystore.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption())
                             + self.files.server_cert.read_bytes())
        keystore.chmod(0o600)
        self._broker_password = secrets.token_urlsafe(24)
        self.principals = {s: Principal(s, principal(s), secrets.token_urlsafe(24)) for s in SERVICES}
        self.grants = {principal(s): acls
                       for s, acls in service_acls(joiner_app_id).items()}
        users = [(BROKER_USER, self._broker_password),
                 *((p.username, p.password) for p in self.principals.values())]
        format_args = [arg for user, pw in users
                       for arg in ("--add-scram", f"{MECHANISM}=[name={user},password={pw}]")]
        jaas_scram = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
                      f'username="{BROKER_USER}" password="{self._broker_password}";')
        jaas_plain = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                      f'username="{BROKER_USER}" password="{self._broker_password}" '
                      f'user_{BROKER_USER}="{self._broker_password}";')
        properties = {
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "listener.name.client.scram-sha-512.sasl.jaas.config": jaas_scram,
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": jaas_plain,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": keystore,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": self.files.ca,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{BROKER_USER}",
            "allow.everyone.if.no.acl.found": "false",
        }
        self.kafka = ApacheKafka(port, directory=directory / "kafka", properties=properties,
                                 format_args=format_args, client_listener="SASL_SSL",
                                 controller_listener="SASL_PLAINTEXT")

    # The process side is the plain broker's.
    def start(self, timeout_s: float = 60.0) -> str:
        bootstrap = self.kafka.start(timeout_s)
        if not (self.directory / "acls-created").exists():
            asyncio.run(create_acls(self.super_user(), self.grants))
            (self.directory / "acls-created").write_text("")
        return bootstrap

    def stop(self, grace_s: float = 10.0) -> None:
        self.kafka.stop(grace_s)

    def running(self) -> bool:
        return self.kafka.running()

    @property
    def exit_status(self) -> int | None:
        return self.kafka.exit_status

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    @property
    def log_path(self) -> Path:
        return self.kafka.log_path

    def log_tail(self, max_bytes: int = 4000) -> str:
        return self.kafka.log_tail(max_bytes)

    # ------------------------------------------------------------------ clients

    def security(self, username: str, password: str) -> KafkaSecurity:
        from pydantic import SecretStr

        return KafkaSecurity(protocol="SASL_SSL", cafile=str(self.files.ca), mechanism=MECHANISM,
                             username=username, password=SecretStr(password))

    def super_user(self) -> Kafka:
        return Kafka(self.kafka.bootstrap, self.security(BROKER_USER, self._broker_password), KAFKA)

    def client(self, service: str) -> Kafka:
        p = self.principals[service]
        return Kafka(self.kafka.bootstrap, self.security(p.username, p.password), KAFKA)

    def settings(self, service: str) -> dict[str, str]:
        """`service`'s PERISCOPE_* settings (lower-case names without the prefix), bootstrap included."""
        p = self.principals[service]
        return {"kafka_bootstrap": self.kafka.bootstrap, "kafka_profile": "kafka",
                "kafka_security_protocol": "SASL_SSL", "kafka_ssl_cafile": str(self.files.ca),
                "kafka_sasl_mechanism": MECHANISM, "kafka_sasl_username": p.username,
                "kafka_sasl_password": p.password}

    def credentials(self, directory: Path) -> Path:
        """Write `ca.crt` and `<service>.env` (PERISCOPE_KAFKA_* lines) for every principal."""
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        (directory / "ca.crt").write_bytes(self.files.ca.read_bytes())
        for service in self.principals:
            values = self.settings(service) | {"kafka_ssl_cafile": str(directory / "ca.crt")}
            env = directory / f"{service}.env"
            env.write_text("".join(f"PERISCOPE_{k.upper()}={v}\n" for k, v in values.items()))
            env.chmod(0o600)
        return directory
