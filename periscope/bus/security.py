"""How every Kafka client of ours authenticates: TLS, mutual TLS and SASL, from one set of settings.

`KafkaSecuritySettings` holds the PERISCOPE_KAFKA_* variables (every service's settings derive from
it through periscope.config); `KafkaSecurity` is the resolved, immutable form that clients take and
turns it into aiokafka's keyword arguments and Faust's `broker_credentials`. The SASL password comes
from PERISCOPE_KAFKA_SASL_PASSWORD or from a file that is read again whenever it changes (a rotated
Kubernetes Secret), so a client built after a rotation uses the new password. The password is a
SecretStr and never appears in a repr, a log line or an error message.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSecurityError(RuntimeError):
    """A TLS or SASL setting, certificate or credential is wrong; the message is one line naming it."""


_password_cache: dict[str, tuple[tuple[int, int, int], str]] = {}
_password_lock = threading.Lock()


def read_password_file(path: str) -> str:
    """The password in `path` (one trailing newline stripped), re-read when the file changes.

    A mounted Secret is replaced by swapping a symlink, so the file's identity (inode), size and
    modification time all change on rotation."""
    try:
        st = os.stat(path)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with _password_lock:
            cached = _password_cache.get(path)
            if cached is not None and cached[0] == key:
                return cached[1]
        value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as e:
        raise KafkaSecurityError(
            f"PERISCOPE_KAFKA_SASL_PASSWORD_FILE {path}: cannot read ({e.strerror or type(e).__name__})"
        ) from None
    with _password_lock:
        _password_cache[path] = (key, value)
    return value


class KafkaSecurity(BaseModel):
    """The resolved security settings of a Kafka client (PLAINTEXT by default)."""

    model_config = ConfigDict(frozen=True)

    protocol: Protocol = "PLAINTEXT"
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    check_hostname: bool = True
    mechanism: Mechanism = "PLAIN"
    username: str = ""
    password: SecretStr = SecretStr("")
    password_file: str = ""

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def describe(self) -> str:
        """A loggable summary: protocol, mechanism and user, never the password or key material."""
        parts: list[str] = [self.protocol]
        if self.sasl:
            parts.append(f"{self.mechanism} user {self.username or '(none)'}")
        if self.tls and self.certfile:
            parts.append("client certificate")
        return ", ".join(parts)

    def check(self) -> None:
        """Raise KafkaSecurityError naming the first setting that cannot work."""
        if (self.certfile or self.keyfile) and not (self.certfile and self.keyfile):
            raise KafkaSecurityError(
                "PERISCOPE_KAFKA_SSL_CERTFILE and PERISCOPE_KAFKA_SSL_KEYFILE go together")
        for name, path in (("SSL_CAFILE", self.cafile), ("SSL_CERTFILE", self.certfile),
                           ("SSL_KEYFILE", self.keyfile), ("SASL_PASSWORD_FILE", self.password_file)):
            if path and not os.path.isfile(path):
                raise KafkaSecurityError(f"PERISCOPE_KAFKA_{name} {path}: no such file")
        if self.sasl:
            if not self.username:
                raise KafkaSecurityError(f"PERISCOPE_KAFKA_SECURITY_PROTOCOL={self.protocol} needs "
                                         "PERISCOPE_KAFKA_SASL_USERNAME")
            if not self.password_file and not self.password.get_secret_value():
                raise KafkaSecurityError(
                    f"PERISCOPE_KAFKA_SECURITY_PROTOCOL={self.protocol} needs "
                    "PERISCOPE_KAFKA_SASL_PASSWORD or PERISCOPE_KAFKA_SASL_PASSWORD_FILE")

    def sasl_password(self) -> str:
        """The current password: the file's content when a file is set (re-read after a change)."""
        if self.password_file:
            return read_password_file(self.password_file)
        return self.password.get_secret_value()

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (system CAs unless a CA file is given), or None without TLS."""
        if not self.tls:
            return None
        self.check()
        try:
            ctx = ssl.create_default_context(cafile=self.cafile or None)
            ctx.check_hostname = self.check_hostname
            if self.certfile:
                ctx.load_cert_chain(self.certfile, self.keyfile)
        except ssl.SSLError as e:
            which = "client certificate/key" if self.certfile else "CA file"
            detail = e.reason or e.strerror or "not PEM"
            raise KafkaSecurityError(f"cannot load the {which} ({detail})") from None
        except OSError as e:
            raise KafkaSecurityError(f"cannot read TLS files: {e.strerror or type(e).__name__}") from None
        return ctx

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for AIOKafkaProducer/Consumer/AdminClient."""
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            kwargs["ssl_context"] = self.ssl_context()
        if self.sasl:
            self.check()
            kwargs.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                          sasl_plain_password=self.sasl_password())
        return kwargs

    def faust_credentials(self) -> Any:
        """Faust's `broker_credentials`: the same protocol, context and SASL settings (None = PLAINTEXT).

        Faust hands them to the aiokafka consumer, producer and admin clients it creates (the
        changelog producer included)."""
        from faust.auth import SASLCredentials, SSLCredentials

        if self.sasl:
            return SASLCredentials(username=self.username, password=self.sasl_password(),
                                   ssl_context=self.ssl_context(), mechanism=self.mechanism)
        if self.tls:
            return SSLCredentials(self.ssl_context())
        return None


class KafkaSecuritySettings(BaseSettings):
    """The PERISCOPE_KAFKA_* security variables (see CONTRACTS.md); mixed into ServiceSettings."""

    kafka_security_protocol: Protocol = Field(default="PLAINTEXT", description=(
        "how clients talk to the broker: TLS (`SSL`), SASL authentication, both, or neither"))
    kafka_ssl_cafile: str = Field(default="", description=(
        "PEM file of the CAs the broker's certificate is checked against (empty: the system's)"))
    kafka_ssl_certfile: str = Field(default="", description="client certificate (PEM), for mutual TLS; with "
                                                    "kafka_ssl_keyfile")
    kafka_ssl_keyfile: str = Field(default="", description="the client certificate's private key (PEM)")
    kafka_ssl_check_hostname: bool = Field(default=True, description=(
        "check the broker's certificate names its host"))
    kafka_sasl_mechanism: Mechanism = Field(default="PLAIN", description="the SASL mechanism")
    kafka_sasl_username: str = Field(default="", description="SASL user (the service's principal)")
    kafka_sasl_password: SecretStr = Field(default=SecretStr(""), description="SASL password (never logged)")
    kafka_sasl_password_file: str = Field(default="", description=(
        "a file holding the SASL password, read again whenever it changes (a rotated Secret)"))

    def kafka_security(self) -> KafkaSecurity:
        return KafkaSecurity(
            protocol=self.kafka_security_protocol, cafile=self.kafka_ssl_cafile,
            certfile=self.kafka_ssl_certfile, keyfile=self.kafka_ssl_keyfile,
            check_hostname=self.kafka_ssl_check_hostname, mechanism=self.kafka_sasl_mechanism,
            username=self.kafka_sasl_username, password=self.kafka_sasl_password,
            password_file=self.kafka_sasl_password_file)


PLAINTEXT = KafkaSecurity()


class SaslRedaction(logging.Filter):
    """aiokafka logs every request at DEBUG, SASL ones with their bytes: PLAIN's carry the password
    itself, SCRAM's the proof. Such lines are kept with the bytes cut out."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is logging's business, not ours
            return True
        if "sasl_auth_bytes" in message:
            record.msg, record.args = message.split("sasl_auth_bytes=")[0] + "sasl_auth_bytes=<redacted>)", ()
        return True


logging.getLogger("aiokafka.conn").addFilter(SaslRedaction())
