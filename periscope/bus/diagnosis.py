"""Why a Kafka client cannot connect, in one line a person can act on.

aiokafka logs a failed TLS handshake or SASL exchange and then reports only "Unable to bootstrap".
`check_connection` repeats the first steps of a connection to each bootstrap server by hand (TCP, the
TLS handshake with the client's own context, an ApiVersions request, then aiokafka's own SASL
exchange) and turns a certificate, host name, credential or protocol problem into a
KafkaSecurityError. A broker that is simply not up yet is not such a problem: services retry that.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from typing import Any

from aiokafka.conn import create_conn

from periscope.bus.security import KafkaSecurity, KafkaSecurityError

_NAME_MISMATCH = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_HANDSHAKE_S = 8.0
_API_VERSIONS = struct.pack(">hhih", 18, 0, 7, 9) + b"periscope"
# Metadata v4 for no topics (an empty array) and no auto-creation: the oldest version Kafka 4 still
# serves (KIP-896 removed v0-v3; a broker closes the connection on a removed version).
_METADATA = struct.pack(">hhih", 3, 4, 8, 9) + b"periscope" + struct.pack(">i", 0) + b"\x00"
_MAX_ANSWER = 64 * 1024 * 1024
_UNREACHABLE = "unreachable"  # compared by identity: no problem message is this very object


def bootstrap_servers(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


async def check_connection(bootstrap: str, security: KafkaSecurity, timeout_s: float = 20.0) -> None:
    """Raise KafkaSecurityError when the bootstrap servers refuse this client's TLS or SASL settings.

    Returns quietly when one server accepts the client, or when none could be reached at all (a
    broker not up yet is retried by the caller). Takes at most about `timeout_s` in all."""
    security.check()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    problems = []
    for host, port in bootstrap_servers(bootstrap):
        try:
            left = max(0.1, deadline - loop.time())
            problem = await asyncio.wait_for(_diagnose(host, port, security), left)
        except TimeoutError:
            problem = _UNREACHABLE
        if problem is None:
            return
        if problem is not _UNREACHABLE:
            problems.append(problem)
        if loop.time() >= deadline:
            break
    if problems:
        raise KafkaSecurityError(problems[0])


async def _diagnose(host: str, port: int, security: KafkaSecurity) -> str | None:
    """None when the server accepts the client, _UNREACHABLE, or the problem in one line."""
    where = f"{host}:{port}"
    if not await _reachable(host, port):
        return _UNREACHABLE  # not a security problem: the caller retries
    try:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=security.ssl_context(), server_hostname=host if security.tls else None,
            ssl_handshake_timeout=_HANDSHAKE_S if security.tls else None)
    except ssl.SSLCertVerificationError as e:
        return _certificate_problem(where, security, e)
    except ssl.SSLError as e:
        return _tls_problem(where, security, e)
    except (OSError, TimeoutError):
        # A plaintext Kafka listener reads a ClientHello as the length of a huge request and waits.
        if security.tls and await _answers_kafka(host, port, None):
            return _not_tls(where, security)
        return _UNREACHABLE
    answered = await _api_versions(reader, writer, metadata=not security.sasl)
    if isinstance(answered, ssl.SSLError):
        return _tls_problem(where, security, answered)
    if answered == "sasl":
        return (f"the Kafka listener at {where} answered ApiVersions but closed the connection on a "
                f"Metadata request: it requires SASL; use {'SASL_SSL' if security.tls else 'SASL_PLAINTEXT'} "
                "with PERISCOPE_KAFKA_SASL_MECHANISM, _USERNAME and _PASSWORD")
    if not answered:
        if security.tls:
            # With TLS 1.3 a broker checks the client certificate after the client's side of the
            # handshake is done; a refusal then shows as a closed connection (often without an alert).
            if not security.certfile:
                return (f"the broker at {where} closed the TLS connection without answering: it requires a "
                        "client certificate; set PERISCOPE_KAFKA_SSL_CERTFILE and "
                        "PERISCOPE_KAFKA_SSL_KEYFILE")
            return (f"the broker at {where} closed the TLS connection without answering: it did not accept "
                    "the client certificate in PERISCOPE_KAFKA_SSL_CERTFILE (not signed by a CA it trusts?)")
        if await _speaks_tls(host, port):
            return (f"the Kafka listener at {where} speaks TLS but PERISCOPE_KAFKA_SECURITY_PROTOCOL is "
                    f"{security.protocol}: use {'SASL_SSL' if security.sasl else 'SSL'}")
        return f"the Kafka listener at {where} did not answer a Kafka request over {security.protocol}"
    return await _sasl_problem(host, port, security) if security.sasl else None


async def _reachable(
    host: str, port: int, tls: ssl.SSLContext | None = None, wait_s: float = _HANDSHAKE_S
) -> bool:
    """A TCP connection (and a TLS handshake, with `tls`) completes within `wait_s`."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=tls), wait_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes,
                   correlation: int) -> bool:
    writer.write(struct.pack(">i", len(request)) + request)
    size, got = struct.unpack(">ii", await asyncio.wait_for(reader.readexactly(8), _HANDSHAKE_S))
    if got != correlation or not 4 <= size <= _MAX_ANSWER:
        return False
    await asyncio.wait_for(reader.readexactly(size - 4), _HANDSHAKE_S)
    return True


async def _api_versions(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        metadata: bool = False) -> bool | str | ssl.SSLError:
    """True when the listener answers an ApiVersions request (and, with `metadata`, a Metadata request:
    "sasl" when only the first is answered, as by a listener that wants SASL first); an SSLError
    raised on the way is returned."""
    versions_answered = False
    try:
        if not await _request(reader, writer, _API_VERSIONS, 7):
            return False
        versions_answered = True
        if metadata and not await _request(reader, writer, _METADATA, 8):
            return "sasl"
        return True
    except ssl.SSLError as e:
        return e
    except (OSError, asyncio.IncompleteReadError, TimeoutError, struct.error):
        return "sasl" if versions_answered else False
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _answers_kafka(host: str, port: int, context: ssl.SSLContext | None) -> bool:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context),
                                                _HANDSHAKE_S)
    except (OSError, TimeoutError):
        return False
    return await _api_versions(reader, writer) is True


def _not_tls(where: str, security: KafkaSecurity) -> str:
    return (f"the Kafka listener at {where} does not speak TLS but PERISCOPE_KAFKA_SECURITY_PROTOCOL is "
            f"{security.protocol}: use {'SASL_PLAINTEXT' if security.sasl else 'PLAINTEXT'}")


async def _speaks_tls(host: str, port: int) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return await _reachable(host, port, ctx, 5)


def _certificate_problem(where: str, security: KafkaSecurity, e: ssl.SSLCertVerificationError) -> str:
    detail = e.verify_message or e.reason or "verification failed"
    if e.verify_code in _NAME_MISMATCH:
        return (f"the broker certificate of {where} does not match the host name ({detail}); connect by a "
                "name the certificate lists, or set PERISCOPE_KAFKA_SSL_CHECK_HOSTNAME=false")
    trusted = (f"the CA in PERISCOPE_KAFKA_SSL_CAFILE {security.cafile}" if security.cafile
               else "the system CAs")
    return f"the broker certificate of {where} is not trusted by {trusted} ({detail})"


def _tls_problem(where: str, security: KafkaSecurity, e: ssl.SSLError) -> str:
    reason = (e.reason or str(e)).upper()
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason or "PACKET_LENGTH" in reason:
        return _not_tls(where, security)
    if "CERTIFICATE_REQUIRED" in reason or ("HANDSHAKE_FAILURE" in reason and not security.certfile):
        return (f"the broker at {where} requires a client certificate: set PERISCOPE_KAFKA_SSL_CERTFILE "
                "and PERISCOPE_KAFKA_SSL_KEYFILE")
    if any(a in reason for a in ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "DECRYPT_ERROR")):
        return (f"the broker at {where} rejected the client certificate in PERISCOPE_KAFKA_SSL_CERTFILE "
                f"({e.reason})")
    return f"TLS with the broker at {where} failed ({e.reason or type(e).__name__})"


async def _sasl_problem(host: str, port: int, security: KafkaSecurity) -> str | None:
    where = f"{host}:{port}"
    kwargs: dict[str, Any] = security.aiokafka_kwargs()
    try:
        conn = await create_conn(host, port, client_id="periscope-check", request_timeout_ms=10_000,
                                 **kwargs)
    except Exception as e:  # a Kafka error, or a ValueError/KeyError from a refused SCRAM exchange
        name = type(e).__name__
        if "Unsupported" in name:
            return f"the broker at {where} does not offer SASL mechanism {security.mechanism}"
        if "Authentication" in name or "Sasl" in name or isinstance(e, ValueError | KeyError):
            return (f"SASL {security.mechanism} authentication of user {security.username} failed at "
                    f"{where}: wrong username or password")
        # The listener answered a Kafka request just before: a close now is the broker ending the SASL
        # exchange (some brokers close instead of answering an unknown mechanism or bad credentials).
        return (f"the broker at {where} closed the connection during SASL {security.mechanism} for user "
                f"{security.username}: mechanism not offered or credentials refused")
    conn.close()
    return None
