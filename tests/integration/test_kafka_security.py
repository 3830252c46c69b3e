"""Every client over TLS, mutual TLS and SASL against a real broker, and the one-line errors.

The embedded broker's own TLS listener does not complete a handshake, so each broker here sits behind
the project's TLS-terminating proxy and advertises the proxy's address: bootstrap and per-broker
connections must all speak TLS. SASL runs against the embedded broker started with --authentication;
it offers SCRAM but cannot create a user while authentication is on (its memory store starts empty
and the user-creation request itself must be authenticated), so only refused credentials are tested
here and successful SASL is covered by the settings tests in tests/unit/test_kafka_security.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from periscope.bus import topics as t
from periscope.bus.admin import ensure_topics
from periscope.bus.clients import Kafka
from periscope.bus.producer import Publisher
from periscope.bus.profile import EMBEDDED
from periscope.bus.security import KafkaSecurity
from periscope.contract.values import rfc3339
from periscope.core.model import NodeInput
from periscope.devkit.consumer import consume
from periscope.devkit.embedded import EmbeddedBroker, resolve_binary
from periscope.devkit.launch import free_port
from periscope.devkit.secure_broker import CertificateFiles, SecureBroker, make_certificates
from periscope.devkit.tlsproxy import TlsProxy, server_context
from tests.integration.test_replay import TOPIC
from tests.unit.core_builders import alloc, ck, gpu, inventory, pod, pr, uid
from tests.unit.test_replay_owners import relocate

PASSWORD = "s3cret-pw-4f1d9b"
SERVICES = ("probe", "watch", "join", "api")


class TlsBroker:
    def __init__(self, files: CertificateFiles, client_ca: str | None = None) -> None:
        self.files = files
        port = free_port()
        self.broker = EmbeddedBroker(advertised_port=port)
        self.broker.start()
        self.proxy = TlsProxy(server_context(str(files.server_cert), str(files.server_key), client_ca),
                              self.broker.host, self.broker.port, port=port)
        self.bootstrap = self.proxy.start()

    def stop(self) -> None:
        self.proxy.stop()
        self.broker.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CertificateFiles]:
    d = tmp_path_factory.mktemp("certs")
    return {"good": make_certificates(d / "good"),
            "other": make_certificates(d / "other", ca_name="Other CA"),
            "elsewhere": make_certificates(d / "elsewhere", hosts=("broker.example",))}


@pytest.fixture(scope="module")
def tls(certs: dict[str, CertificateFiles]) -> Iterator[TlsBroker]:
    b = TlsBroker(certs["good"])
    yield b
    b.stop()


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    b = SecureBroker(tmp_path_factory.mktemp("mtls"))
    b.start()
    yield b
    b.stop()


def mtls_kafka(b: SecureBroker) -> Kafka:
    return Kafka(b.proxy.address, b.security, EMBEDDED)


def env_of(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERISCOPE_")}
    env.update({f"PERISCOPE_{k.upper()}": v for k, v in {"kafka_profile": "embedded", **settings}.items()})
    return env


def ssl_env(bootstrap: str, ca: Path, **more: str) -> dict[str, str]:
    return env_of(kafka_bootstrap=bootstrap, kafka_security_protocol="SSL", kafka_ssl_cafile=str(ca), **more)


def run(args: list[str], env: dict[str, str], timeout_s: float = 60) -> tuple[int, str, str, float]:
    started = time.monotonic()
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - started


def admin(env: dict[str, str]) -> tuple[int, str, str, float]:
    return run([sys.executable, "-m", "periscope.bus.admin"], env)


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def assert_no_key_material(text: str, files: CertificateFiles) -> None:
    for key in (files.client_key, files.server_key):
        body = [line for line in key.read_text().splitlines() if line and not line.startswith("-----")]
        assert not any(line in text for line in body), f"key material of {key.name} in the output"


def test_topics_and_replay_through_a_tls_only_listener(tls: TlsBroker, tmp_path: Path) -> None:
    env = ssl_env(tls.bootstrap, tls.files.ca)
    rc, out, err, _ = admin(env)
    assert rc == 0, err
    assert f"topics ready on {tls.bootstrap}" in out
    # a plaintext client finds no Kafka at the advertised address: everything goes through TLS
    rc, _, err, _ = admin(env_of(kafka_bootstrap=tls.bootstrap))
    assert rc == 1 and "speaks TLS" in one_line(err) and "use SSL" in err

    node, g = f"tls-replay-{time.time_ns()}", gpu(0)
    base = 2_100_000_000_000
    events: list[NodeInput] = [relocate(e, node, base) for e in (
        inventory(0), pod(1, "train-0", 0), alloc(1000, pr("ml", "train-0", (g,)), ck(uid(1), (g,))))]
    security = KafkaSecurity(protocol="SSL", cafile=str(tls.files.ca))

    async def publish() -> None:
        async with Publisher(Kafka(tls.bootstrap, security, EMBEDDED), "tls-test") as pub:
            for ev in events:
                await pub.send(TOPIC[type(ev)], node, ev)

    asyncio.run(publish())
    rc, out, err, _ = run([sys.executable, "-m", "periscope.cli.main", "replay", "--at", rfc3339(base + 5000),
                           "--node", node, "--format", "json", "--quiet"], env)
    assert rc == 0, err
    assert [(i["gpu_uuid"], i["pod_uid"]) for i in json.loads(out)["items"]] == [(g, uid(1))]


def test_a_ca_that_did_not_sign_the_broker_fails_fast_in_one_line(tls: TlsBroker,
                                                                  certs: dict[str, CertificateFiles]) -> None:
    rc, _, err, took = admin(ssl_env(tls.bootstrap, certs["other"].ca))
    assert rc == 1 and took < 45
    line = one_line(err)
    assert "is not trusted by the CA in PERISCOPE_KAFKA_SSL_CAFILE" in line and str(certs["other"].ca) in line
    rc, _, err, _ = run([sys.executable, "-m", "periscope.cli.main", "replay", "--at", rfc3339(0), "--quiet"],
                        ssl_env(tls.bootstrap, certs["other"].ca))
    assert rc == 1 and "is not trusted" in one_line(err)


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_exits_at_start_on_an_untrusted_certificate(
        tls: TlsBroker, certs: dict[str, CertificateFiles], service: str, tmp_path: Path) -> None:
    env = ssl_env(tls.bootstrap, certs["other"].ca, health_port="0", web_port="0", api_port="0",
                  data_dir=str(tmp_path), kubeconfig=str(tmp_path / "kubeconfig"))
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    rc, out, err, took = run([sys.executable, "-m", "periscope.cli.main", service], env, timeout_s=60)
    assert rc == 1 and took < 30, (out, err)
    line = one_line(err)
    assert line.startswith("periscope: ") and "is not trusted" in line, line


def test_hostname_mismatch_is_named(certs: dict[str, CertificateFiles]) -> None:
    b = TlsBroker(certs["elsewhere"])
    try:
        rc, _, err, _ = admin(ssl_env(b.bootstrap, certs["elsewhere"].ca))
        assert rc == 1 and "does not match the host name" in one_line(err)
        # the documented way out works
        rc, _, err, _ = admin(ssl_env(b.bootstrap, certs["elsewhere"].ca, kafka_ssl_check_hostname="false"))
        assert rc == 0, err
    finally:
        b.stop()


def test_tls_client_at_a_plaintext_listener_is_named(broker: Kafka, certs: dict[str, CertificateFiles]
                                                     ) -> None:
    rc, _, err, _ = admin(ssl_env(broker.bootstrap, certs["good"].ca))
    assert rc == 1 and "does not speak TLS" in one_line(err) and "use PLAINTEXT" in err


def test_mutual_tls(mtls: SecureBroker, unique: str, tmp_path: Path) -> None:
    files = mtls.files
    # no client certificate: the broker's demand is named
    rc, _, err, _ = admin(ssl_env(mtls.proxy.address, files.ca))
    assert rc == 1 and "requires a client certificate" in one_line(err)
    # a client certificate its CA did not sign is refused
    other = make_certificates(tmp_path, ca_name="Other CA")
    rc, _, err, _ = admin(ssl_env(mtls.proxy.address, files.ca, kafka_ssl_certfile=str(other.client_cert),
                                  kafka_ssl_keyfile=str(other.client_key)))
    assert rc == 1 and "did not accept the client certificate" in one_line(err)
    env = ssl_env(mtls.proxy.address, files.ca, kafka_ssl_certfile=str(files.client_cert),
                  kafka_ssl_keyfile=str(files.client_key), log_level="DEBUG")
    rc, out, err, _ = admin(env)
    assert rc == 0, err
    assert_no_key_material(out + err, files)

    async def round_trip() -> list[str]:
        seen: list[str] = []
        stop = asyncio.Event()

        async def handler(topic: t.Topic, key: str | None, obj: object, record: object) -> None:
            seen.append(key or "")
            stop.set()

        task = asyncio.create_task(consume(mtls_kafka(mtls), [t.PODS], None, handler, service="mtls-test",
                                           stop=stop))
        async with Publisher(mtls_kafka(mtls), "mtls-test") as pub:
            await pub.send(t.PODS, f"mtls-{unique}", pod(1, "p", 0))
        await asyncio.wait_for(task, 60)
        return seen

    assert f"mtls-{unique}" in asyncio.run(round_trip())


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The embedded broker with --authentication (SCRAM); no user can be created on it."""
    port, log = free_port(), tmp_path_factory.mktemp("sasl") / "broker.log"
    url = f"tcp://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen([resolve_binary(), "broker", "--listener-url", url,
                                 "--advertised-listener-url", url, "--storage-engine", "memory://tansu/",
                                 "--authentication"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while "ready in" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        # what was tried: creating a user is refused with authentication on
        created = subprocess.run([resolve_binary(), "user", "create", "--broker", url, "--mechanism",
                                  "scram256", "periscope", PASSWORD],
                                 capture_output=True, text=True, timeout=30)
        assert created.returncode != 0
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password_is_one_line_without_the_password(sasl_broker: str, mechanism: str,
                                                         tmp_path: Path) -> None:
    pw_file = tmp_path / "password"
    pw_file.write_text(PASSWORD + "\n")
    env = env_of(kafka_bootstrap=sasl_broker, kafka_security_protocol="SASL_PLAINTEXT",
                 kafka_sasl_mechanism=mechanism, kafka_sasl_username="periscope",
                 kafka_sasl_password_file=str(pw_file), api_port="0")
    rc, out, err, took = admin(env)
    assert rc == 1 and took < 30
    assert f"SASL {mechanism} authentication of user periscope failed" in one_line(err)
    assert "wrong username or password" in err
    rc2, out2, err2, took2 = run([sys.executable, "-m", "periscope.cli.main", "api"], env)
    assert rc2 == 1 and took2 < 30 and "wrong username or password" in one_line(err2)
    # with every client request logged (DEBUG), the SASL exchange is there but not its bytes
    rc4, out4, err4, _ = run([sys.executable, "-m", "periscope.cli.main", "api"],
                             {**env, "PERISCOPE_LOG_LEVEL": "DEBUG"})
    assert rc4 == 1 and "SaslAuthenticateRequest" in err4 and "sasl_auth_bytes=b" not in err4
    assert err4.splitlines()[-1] == err2.strip()
    # the password given directly (not as a file) is not echoed either
    env3 = {k: v for k, v in env.items() if k != "PERISCOPE_KAFKA_SASL_PASSWORD_FILE"}
    env3["PERISCOPE_KAFKA_SASL_PASSWORD"] = PASSWORD
    rc3, out3, err3, _ = run([sys.executable, "-m", "periscope.cli.main", "replay", "--at", rfc3339(0)], env3)
    assert rc3 == 1 and "wrong username or password" in one_line(err3)
    for text in (out, err, out2, err2, out3, err3, out4, err4):
        assert PASSWORD not in text


def test_a_mechanism_the_broker_does_not_offer_is_one_line(sasl_broker: str) -> None:
    env = env_of(kafka_bootstrap=sasl_broker, kafka_security_protocol="SASL_PLAINTEXT",
                 kafka_sasl_mechanism="PLAIN", kafka_sasl_username="periscope", kafka_sasl_password=PASSWORD)
    rc, out, err, _ = admin(env)
    assert rc == 1 and "during SASL PLAIN" in one_line(err) and PASSWORD not in out + err


def test_topics_can_be_created_from_python_over_mutual_tls(mtls: SecureBroker) -> None:
    asyncio.run(ensure_topics(mtls_kafka(mtls)))


def test_a_connected_client_rides_out_a_broker_outage_over_tls(mtls: SecureBroker, unique: str) -> None:
    """The listener goes away after the consumer connected and comes back: the consumer reconnects
    (TLS handshake and all) and sees what is published afterwards."""

    async def scenario() -> list[str]:
        seen: list[str] = []
        stop = asyncio.Event()
        got_first, got_second = asyncio.Event(), asyncio.Event()

        async def handler(topic: t.Topic, key: str | None, obj: object, record: object) -> None:
            seen.append(key or "")
            (got_second if key == f"after-{unique}" else got_first).set()

        task = asyncio.create_task(consume(mtls_kafka(mtls), [t.PODS], None, handler, service="outage-test",
                                           stop=stop, from_beginning=False))
        try:
            async with Publisher(mtls_kafka(mtls), "outage-test") as pub:
                while not got_first.is_set():  # until the consumer is positioned and reading
                    await pub.send(t.PODS, f"before-{unique}", pod(1, "p", 0))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(got_first.wait(), 2)
            await asyncio.to_thread(mtls.proxy.stop)
            await asyncio.sleep(3)
            await asyncio.to_thread(mtls.proxy.start)
            async with Publisher(mtls_kafka(mtls), "outage-test") as pub:
                await pub.send(t.PODS, f"after-{unique}", pod(2, "p", 0))
            await asyncio.wait_for(got_second.wait(), 60)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
        return seen

    assert f"after-{unique}" in asyncio.run(scenario())


def test_a_plaintext_client_at_a_sasl_listener_is_told_to_use_sasl(sasl_broker: str) -> None:
    rc, _, err, took = admin(env_of(kafka_bootstrap=sasl_broker))
    assert rc == 1 and took < 30
    assert "it requires SASL; use SASL_PLAINTEXT" in one_line(err)


def test_an_unreachable_first_bootstrap_server_does_not_hide_the_next_ones_problem(
        tls: TlsBroker, certs: dict[str, CertificateFiles]) -> None:
    servers = f"127.0.0.1:{free_port()},{tls.bootstrap}"
    rc, _, err, _ = admin(ssl_env(servers, certs["other"].ca))
    assert rc == 1 and "is not trusted" in one_line(err)
    rc, _, err, _ = admin(ssl_env(servers, tls.files.ca))
    assert rc == 0, err


def test_the_secure_broker_can_be_restarted_behind_its_proxy(tmp_path: Path) -> None:
    b = SecureBroker(tmp_path)
    address = b.start()
    try:
        b.broker.stop()
        b.broker.start()  # on another free port; the proxy finds it
        assert b.proxy.address == address
        env = ssl_env(address, b.files.ca, kafka_ssl_certfile=str(b.files.client_cert),
                      kafka_ssl_keyfile=str(b.files.client_key))
        rc, _, err, _ = admin(env)
        assert rc == 0, err
    finally:
        b.stop()
