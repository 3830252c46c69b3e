"""The PERISCOPE_KAFKA_* settings reach aiokafka and Faust unchanged, the password is never shown, and a
password file is read again after it changes."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from faust.auth import SASLCredentials, SSLCredentials
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from periscope.bus.security import KafkaSecurity, KafkaSecurityError, read_password_file
from periscope.bus.settings import ServiceSettings
from periscope.devkit.secure_broker import make_certificates
from periscope.settings.joiner import JoinerSettings

SECRET = "pw-unit-7f3a9c"


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    make_certificates(tmp_path)
    return tmp_path


def _env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for k in list(os.environ):
        if k.startswith("PERISCOPE_"):
            monkeypatch.delenv(k)
    for k, v in values.items():
        monkeypatch.setenv(f"PERISCOPE_{k.upper()}", v)


def test_default_is_plaintext(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch)
    sec = ServiceSettings().kafka_security()
    assert sec.aiokafka_kwargs() == {"security_protocol": "PLAINTEXT"}
    assert sec.faust_credentials() is None


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_ssl_settings_reach_aiokafka_and_faust(monkeypatch: pytest.MonkeyPatch, certs: Path,
                                                    mechanism: str) -> None:
    _env(monkeypatch, kafka_security_protocol="SASL_SSL", kafka_ssl_cafile=str(certs / "ca.pem"),
         kafka_sasl_mechanism=mechanism, kafka_sasl_username="periscope", kafka_sasl_password=SECRET)
    sec = JoinerSettings().kafka_security()  # every service's settings have the fields
    kwargs = sec.aiokafka_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == mechanism
    assert kwargs["sasl_plain_username"] == "periscope"
    assert kwargs["sasl_plain_password"] == SECRET
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext) and kwargs["ssl_context"].check_hostname
    # aiokafka accepts them as they are
    async def client_settings() -> tuple[str, str]:
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", **kwargs)
        return consumer._client._sasl_mechanism, consumer._client._sasl_plain_password

    assert asyncio.run(client_settings()) == (mechanism, SECRET)
    # and Faust hands the same to the aiokafka clients it creates
    creds = sec.faust_credentials()
    assert isinstance(creds, SASLCredentials)
    faust_kwargs = credentials_to_aiokafka_auth(creds)
    assert faust_kwargs["security_protocol"] == "SASL_SSL"
    assert faust_kwargs["sasl_mechanism"] == mechanism
    assert faust_kwargs["sasl_plain_username"] == "periscope"
    assert faust_kwargs["sasl_plain_password"] == SECRET
    assert isinstance(faust_kwargs["ssl_context"], ssl.SSLContext)


def test_the_joiner_app_gets_the_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from services.joiner.app import create_app

    _env(monkeypatch, kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="SCRAM-SHA-256",
         kafka_sasl_username="joiner", kafka_sasl_password=SECRET)
    app = create_app(JoinerSettings(), data_dir=str(tmp_path))
    auth = credentials_to_aiokafka_auth(app.conf.broker_credentials)
    assert (auth["security_protocol"], auth["sasl_mechanism"], auth["sasl_plain_username"],
            auth["sasl_plain_password"]) == ("SASL_PLAINTEXT", "SCRAM-SHA-256", "joiner", SECRET)


def test_sasl_plaintext_has_no_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="SCRAM-SHA-512",
         kafka_sasl_username="u", kafka_sasl_password=SECRET)
    sec = ServiceSettings().kafka_security()
    assert "ssl_context" not in sec.aiokafka_kwargs()
    assert credentials_to_aiokafka_auth(sec.faust_credentials())["security_protocol"] == "SASL_PLAINTEXT"


def test_mutual_tls_loads_the_client_certificate(monkeypatch: pytest.MonkeyPatch, certs: Path) -> None:
    _env(monkeypatch, kafka_security_protocol="SSL", kafka_ssl_cafile=str(certs / "ca.pem"),
         kafka_ssl_certfile=str(certs / "client.pem"), kafka_ssl_keyfile=str(certs / "client-key.pem"),
         kafka_ssl_check_hostname="false")
    sec = ServiceSettings().kafka_security()
    ctx = sec.ssl_context()
    assert ctx is not None and not ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    creds = sec.faust_credentials()
    assert isinstance(creds, SSLCredentials)
    assert credentials_to_aiokafka_auth(creds)["security_protocol"] == "SSL"


def test_password_never_in_reprs_or_summaries(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, kafka_security_protocol="SASL_SSL", kafka_sasl_username="u", kafka_sasl_password=SECRET)
    settings = ServiceSettings()
    sec = settings.kafka_security()
    for text in (repr(settings), str(settings), repr(sec), str(sec), sec.describe(),
                 settings.model_dump_json(), repr(sec.faust_credentials())):
        assert SECRET not in text


def test_password_file_is_read_again_after_rotation(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("first\n")
    sec = KafkaSecurity(protocol="SASL_PLAINTEXT", username="u", password_file=str(path))
    assert sec.aiokafka_kwargs()["sasl_plain_password"] == "first"
    # A Secret volume swaps the file for a new one
    new = tmp_path / "password.new"
    new.write_text("second-longer\n")
    new.replace(path)
    assert sec.aiokafka_kwargs()["sasl_plain_password"] == "second-longer"
    assert read_password_file(str(path)) == "second-longer"


@pytest.mark.parametrize(("settings", "message"), [
    ({"protocol": "SASL_SSL"}, "needs PERISCOPE_KAFKA_SASL_USERNAME"),
    ({"protocol": "SASL_SSL", "username": "u"}, "needs PERISCOPE_KAFKA_SASL_PASSWORD or"),
    ({"protocol": "SSL", "cafile": "/nonexistent/ca.pem"},
     "PERISCOPE_KAFKA_SSL_CAFILE /nonexistent/ca.pem: no such"),
    ({"protocol": "SSL", "certfile": "c.pem"}, "go together"),
    ({"protocol": "SASL_PLAINTEXT", "username": "u", "password_file": "/nonexistent/pw"}, "no such file"),
])
def test_unusable_settings_are_named(settings: dict[str, str], message: str) -> None:
    with pytest.raises(KafkaSecurityError, match=message):
        KafkaSecurity.model_validate(settings).aiokafka_kwargs()


def test_unknown_protocol_or_mechanism_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, kafka_security_protocol="TLS")
    with pytest.raises(ValueError, match="kafka_security_protocol"):
        ServiceSettings()
    _env(monkeypatch, kafka_sasl_mechanism="GSSAPI")
    with pytest.raises(ValueError, match="kafka_sasl_mechanism"):
        ServiceSettings()


def test_sasl_bytes_are_cut_from_aiokafka_debug_lines(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.DEBUG, logger="aiokafka.conn"):
        logging.getLogger("aiokafka.conn").debug(
            "Request to %s %s: %s", "127.0.0.1:9093", 3,
            f"SaslAuthenticateRequest_v1(sasl_auth_bytes=b'\\x00periscope\\x00{SECRET}')")
    assert SECRET not in caplog.text
    assert "SaslAuthenticateRequest_v1(sasl_auth_bytes=<redacted>)" in caplog.text
