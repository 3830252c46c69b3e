"""The embedded broker behind TLS, for `periscope up --secure`.

The broker listens in plaintext on a private loopback port and advertises the TLS proxy's address
(periscope.bus.tlsproxy), so every client connection, bootstrap and per-broker, goes through TLS. The
proxy requires a client certificate (mutual TLS). Certificates are made fresh in the run's work
directory. SASL is not enabled: the embedded broker keeps users in its memory store, and with
authentication on it refuses the request that would create the first one.
"""

from __future__ import annotations

from pathlib import Path

from periscope.bus.broker import EmbeddedBroker, free_port
from periscope.bus.security import KafkaSecurity
from periscope.bus.tlsproxy import TlsProxy, server_context
from periscope.sim.certs import make_certificates


class SecureBroker:
    """An EmbeddedBroker reachable only through a mutual-TLS proxy on `port` (0 = a free port)."""

    def __init__(self, directory: Path, port: int = 0, log_path: Path | None = None) -> None:
        self.files = make_certificates(directory)
        self.port = port or free_port()
        self.broker = EmbeddedBroker(port=0, log_path=log_path, advertised_port=self.port)
        self.proxy = TlsProxy(server_context(str(self.files.server_cert), str(self.files.server_key),
                                             client_cafile=str(self.files.ca)),
                              port=self.port, target=lambda: (self.broker.host, self.broker.port))
        self.security = KafkaSecurity(protocol="SSL", cafile=str(self.files.ca),
                                      certfile=str(self.files.client_cert),
                                      keyfile=str(self.files.client_key))

    def start(self) -> str:
        """Start broker and proxy; returns the TLS bootstrap address."""
        self.broker.start()  # a restart may pick another port: the proxy asks for it per connection
        try:
            return self.proxy.start()
        except BaseException:
            self.broker.stop()
            raise

    def settings(self) -> dict[str, str]:
        """The PERISCOPE_* settings (lower-case names without the prefix) a client needs."""
        return {"kafka_security_protocol": self.security.protocol, "kafka_ssl_cafile": self.security.cafile,
                "kafka_ssl_certfile": self.security.certfile, "kafka_ssl_keyfile": self.security.keyfile}

    def stop(self) -> None:
        self.proxy.stop()
        self.broker.stop()
