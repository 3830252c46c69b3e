"""The broker a development stack or a test session runs: the embedded one or Apache Kafka, plain or
secured, behind one interface.

`LocalBroker` starts it, says how each service connects (`settings(service)`: the PERISCOPE_KAFKA_*
values, profile included, that a child process is started with; `client(service)`: the same as a
`Kafka` connection for in-process clients), and tells when the broker process has gone.

- embedded: the development kit's in-memory broker (profile `embedded`); `secure` puts it behind a
  mutual-TLS proxy with one client certificate for everyone;
- kafka: Apache Kafka (KRaft) from the project's cached distribution (profile `kafka`); `secure` runs
  TLS + SASL/SCRAM-SHA-512 on Kafka's own listener with a principal per service and ACLs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from periscope.bus.clients import Kafka
from periscope.bus.profile import EMBEDDED, KAFKA
from periscope.bus.security import PLAINTEXT
from periscope.devkit.apache_kafka import ApacheKafka
from periscope.devkit.embedded import EmbeddedBroker
from periscope.devkit.secure_broker import SecureBroker
from periscope.devkit.secure_kafka import SecureKafka

BrokerKind = Literal["embedded", "kafka"]
KINDS: tuple[BrokerKind, ...] = ("embedded", "kafka")


class _Process(Protocol):
    @property
    def pid(self) -> int | None: ...
    def running(self) -> bool: ...
    @property
    def exit_status(self) -> int | None: ...


class LocalBroker:
    def __init__(self, kind: BrokerKind, directory: Path, *, port: int = 0, secure: bool = False,
                 joiner_app_id: str = "periscope-joiner") -> None:
        self.kind, self.secure, self.directory = kind, secure, directory
        directory.mkdir(parents=True, exist_ok=True)
        self.bootstrap = ""
        self._embedded: EmbeddedBroker | None = None
        self._mtls: SecureBroker | None = None
        self._kafka: ApacheKafka | None = None
        self._sasl: SecureKafka | None = None
        if kind == "embedded" and secure:
            self._mtls = SecureBroker(directory / "tls", port, directory / "broker.log")
        elif kind == "embedded":
            self._embedded = EmbeddedBroker(port=port, log_path=directory / "broker.log")
        elif secure:
            self._sasl = SecureKafka(directory / "kafka-secure", port, joiner_app_id=joiner_app_id)
        else:
            self._kafka = ApacheKafka(port, directory=directory / "kafka")

    @property
    def process(self) -> _Process:
        if self._mtls is not None:
            return self._mtls.broker
        for p in (self._embedded, self._kafka):
            if p is not None:
                return p
        assert self._sasl is not None
        return self._sasl.kafka

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def log_path(self) -> Path | None:
        if self._sasl is not None:
            return self._sasl.log_path
        if self._kafka is not None:
            return self._kafka.log_path
        broker = self._mtls.broker if self._mtls is not None else self._embedded
        return broker.log_path if broker is not None else None

    def start(self) -> str:
        if self._mtls is not None:
            self.bootstrap = self._mtls.start()
        elif self._embedded is not None:
            self.bootstrap = self._embedded.start()
        elif self._sasl is not None:
            self.bootstrap = self._sasl.start()
        else:
            assert self._kafka is not None
            self.bootstrap = self._kafka.start()
        return self.bootstrap

    def stop(self, grace_s: float = 5.0) -> None:
        if self._mtls is not None:
            self._mtls.stop()
        elif self._embedded is not None:
            self._embedded.stop(grace_s)
        elif self._sasl is not None:
            self._sasl.stop(grace_s)
        elif self._kafka is not None:
            self._kafka.stop(grace_s)

    def renew(self, grace_s: float = 1.0) -> None:
        """Replace the embedded broker with a fresh, empty one at the same address (behind the same TLS
        proxy with `secure`). The embedded broker applies no retention (periscope.bus.profile), so this
        is what bounds its memory; Apache Kafka applies retention and is never renewed."""
        broker = self._mtls.broker if self._mtls is not None else self._embedded
        if broker is None:
            raise ValueError("only the embedded broker is renewed; Apache Kafka applies retention")
        broker.restart(grace_s)

    def client(self, service: str = "admin") -> Kafka:
        """How `service` (probe, watcher, joiner, api, admin) connects, as a Kafka connection."""
        if self._sasl is not None:
            return self._sasl.client(service)
        profile = KAFKA if self.kind == "kafka" else EMBEDDED
        return Kafka(self.bootstrap, self._mtls.security if self._mtls is not None else PLAINTEXT, profile)

    def settings(self, service: str) -> dict[str, str]:
        """`service`'s PERISCOPE_KAFKA_* settings (lower-case names without the prefix)."""
        if self._sasl is not None:
            return self._sasl.settings(service)
        out = {"kafka_bootstrap": self.bootstrap, "kafka_profile": self.kind}
        return out | (self._mtls.settings() if self._mtls is not None else {})

    def credentials(self, directory: Path) -> Path | None:
        """With Kafka's own security: a directory of `ca.crt` and `<service>.env` files."""
        return self._sasl.credentials(directory) if self._sasl is not None else None

    def describe(self) -> str:
        """What the banner says after the broker's address ("" for the plain embedded default)."""
        if self._sasl is not None:
            return "Apache Kafka, TLS + SASL/SCRAM-SHA-512, a principal per service with ACLs"
        if self.kind == "kafka":
            return "Apache Kafka"
        return "mutual TLS" if self._mtls is not None else ""

    def lost(self) -> str | None:
        """The line to print when the broker process has exited, else None."""
        return lost_line(self.kind, self.process, self.log_path)


def lost_line(kind: BrokerKind, process: _Process | None, log_path: Path | None = None) -> str | None:
    """The one line that says a broker process has exited, and what that means; None while it runs."""
    if process is None or process.running():
        return None
    status = process.exit_status
    how = f"was killed by signal {-status}" if status is not None and status < 0 else f"exited ({status})"
    if kind == "embedded":
        # It keeps its topics in memory: every event, changelog and committed offset went with it, and
        # services holding state that no longer exists on the bus cannot go on honestly.
        return (f"the embedded broker {how}; every topic and its history were lost with it: stopping "
                "every service (run periscope up again to start afresh)")
    return f"Apache Kafka {how} (its log: {log_path}): stopping every service"
