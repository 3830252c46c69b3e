"""The embedded broker of `periscope up`: behind TLS with `--secure`, and what happens when it dies.

With `--secure` the broker listens in plaintext on a private loopback port and advertises the TLS
proxy's address (periscope.bus.tlsproxy), so every client connection, bootstrap and per-broker, goes
through TLS. The proxy requires a client certificate (mutual TLS). `make_certificates` writes fresh
throwaway ones in the run's work directory (a CA, a broker certificate for the given names and
addresses, a client certificate; never used by a deployment, whose certificates come from its own
CA). SASL is not enabled: the embedded broker keeps users in its memory store, and with
authentication on it refuses the request that would create the first one.

When it dies: it keeps its topics in memory, so a broker that died took every event, changelog and
committed offset with it. Restarting it would leave each service holding state that no longer exists
on the bus (a joiner whose recovered marks are ahead of empty topics, an API whose view has nothing
behind it); a clean stop with a non-zero status is the honest answer, and the one line says so.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from periscope.bus.broker import EmbeddedBroker, free_port
from periscope.bus.security import KafkaSecurity
from periscope.bus.tlsproxy import TlsProxy, server_context

# Services get this long to stop before they are killed, then the simulator, then the broker: Ctrl-C
# (or a dead broker) ends `periscope up` within 10 s even when a service cannot reach the broker.
SERVICES_GRACE_S = 6.0
SIM_GRACE_S = 2.0
BROKER_GRACE_S = 1.0


def broker_lost(broker: EmbeddedBroker | None) -> str | None:
    """The line to print when the broker process has exited, else None."""
    if broker is None or broker.running():
        return None
    status = broker.exit_status
    how = f"was killed by signal {-status}" if status is not None and status < 0 else f"exited ({status})"
    return (f"the embedded broker {how}; every topic and its history were lost with it: stopping every "
            "service (run periscope up again to start afresh)")


# ---------------------------------------------------------------- throwaway certificates


@dataclass(frozen=True, slots=True)
class CertificateFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _sign(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
          issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False,
          sans: list[x509.GeneralName] | None = None,
          usage: x509.ObjectIdentifier | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False), critical=True)
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                                        critical=False)
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_certificates(directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                      ca_name: str = "Periscope test CA", prefix: str = "") -> CertificateFiles:
    """Write <prefix>ca.pem, broker.pem/-key.pem (valid for `hosts`), client.pem/-key.pem."""
    directory.mkdir(parents=True, exist_ok=True)
    files = CertificateFiles(*(directory / f"{prefix}{n}.pem" for n in
                               ("ca", "broker", "broker-key", "client", "client-key")))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _sign(ca_name, ca_key, _name(ca_name), ca_key, ca=True)
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    for cert_path, key_path, subject, sans, usage in (
            (files.server_cert, files.server_key, hosts[0], [_san(h) for h in hosts],
             ExtendedKeyUsageOID.SERVER_AUTH),
            (files.client_cert, files.client_key, "periscope-client", None, ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _sign(subject, key, ca_cert.subject, ca_key, sans=sans, usage=usage)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
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
