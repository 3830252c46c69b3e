"""Throwaway certificates for TLS between the simulated stack's clients and its broker.

`make_certificates` writes a CA, a broker certificate for the given host names/addresses and a client
certificate (for mutual TLS), all signed by that CA, as PEM files. Used by `periscope up --secure` and
the tests; never by a deployment, whose certificates come from its own CA.
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
