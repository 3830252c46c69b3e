"""The embedded broker behind mutual TLS: `periscope up --secure` and the Kafka-security tests.

The broker listens in plaintext on a private loopback port and advertises the TLS proxy's address
(periscope.devkit.tlsproxy), so every client connection, bootstrap and per-broker, goes through TLS. The
proxy requires a client certificate (mutual TLS). `make_certificates` writes fresh throwaway ones (a
CA, a broker certificate for the given names and addresses, a client certificate; never used by a
deployment, whose certificates come from its own CA). SASL is not enabled: the embedded broker keeps
users in its memory store, and with authentication on it refuses the request that would create the
first one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

from periscope.bus.security import KafkaSecurity
from periscope.devkit.embedded import EmbeddedBroker
from periscope.devkit.launch import free_port
from periscope.devkit.tlsproxy import TlsProxy, server_context


@dataclass(frozen=True, slots=True)
class CertificateFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certificates(directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                      ca_name: str = "Periscope test CA", prefix: str = "") -> CertificateFiles:
    """Write <prefix>ca.pem, broker.pem/-key.pem (valid for `hosts`), client.pem/-key.pem (trustme makes
    them: ECDSA keys, certificates good for both server and client authentication)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = CertificateFiles(*(directory / f"{prefix}{n}.pem" for n in
                               ("ca", "broker", "broker-key", "client", "client-key")))
    ca = trustme.CA(organization_name=ca_name)
    ca.cert_pem.write_to_path(str(files.ca))
    server = ca.issue_cert(*hosts, common_name=hosts[0])
    client = ca.issue_cert(common_name="periscope-client")
    for leaf, cert_path, key_path in ((server, files.server_cert, files.server_key),
                                      (client, files.client_cert, files.client_key)):
        leaf.cert_chain_pems[0].write_to_path(str(cert_path))
        leaf.private_key_pem.write_to_path(str(key_path))
        key_path.chmod(0o600)
    return files


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
