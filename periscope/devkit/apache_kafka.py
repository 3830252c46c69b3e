"""Apache Kafka for the development kit: `periscope up --broker kafka` and the real-Kafka test tier.

One KRaft node that is broker and controller at once, run as `java … kafka.Kafka server.properties`
from jars that Maven resolves once (kafka-pom.xml beside this module) into a cache outside the
checkout, `${XDG_CACHE_HOME:-~/.cache}/periscope/kafka-<version>-<pom hash>/`. Storage is formatted
on first start; a restart on the same directory keeps every topic, committed offset and changelog.
The broker logs to a file, never to the terminal, and dies with its owner (the devkit's launcher).
Without `java` (or, before the first resolution, `mvn`) `KafkaUnavailable` says in one line what is
missing and how to get it.
"""

from __future__ import annotations

import atexit
import base64
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from periscope.devkit.embedded import BrokerError, metadata_ready
from periscope.devkit.launch import free_port, spawn, stop_group

POM = Path(__file__).with_name("kafka-pom.xml")
_READY = re.compile(r"Kafka Server started")
_HEAP_MB = 384
_INSTALL_HINT = "install OpenJDK 17+ and Maven (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless maven)"


class KafkaUnavailable(BrokerError):
    """Apache Kafka cannot be run here (no java, or no mvn to resolve it); one line says what to do."""


def kafka_version(pom: Path = POM) -> str:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(pom).getroot().find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise BrokerError(f"{pom}: no kafka.version property")
    return (node.text or "").strip()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "periscope"


def distribution(pom: Path = POM, *, quiet: bool = True) -> Path:
    """The directory of the broker's jars, resolved by Maven on first use and reused afterwards.

    Keyed by the pom's content, so a version change resolves anew; a lock keeps concurrent first
    uses (two test sessions) from resolving into the same place at once."""
    if shutil.which("java") is None:
        raise KafkaUnavailable(f"Apache Kafka needs java on PATH: {_INSTALL_HINT}")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    home = cache_root() / f"kafka-{kafka_version(pom)}-{digest}"
    libs = home / "libs"
    if (home / "complete").exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaUnavailable(f"resolving Apache Kafka's jars needs mvn on PATH: {_INSTALL_HINT}")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / "complete").exists():
            return libs
        staging = Path(tempfile.mkdtemp(prefix="libs-", dir=home))
        argv = [mvn, "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={staging}",
                "-DincludeScope=runtime", *(["-q"] if quiet else [])]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise KafkaUnavailable("mvn could not resolve Apache Kafka " + kafka_version(pom) + ": "
                                   + " | ".join(tail))
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        (home / "complete").write_text(kafka_version(pom) + "\n")
    return libs


def cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (what the storage tool makes).

    Never one that starts with '-' (1 in 64 would): the storage tool's `-t` would take it for an option
    and fail; Kafka's own random ids are drawn again for the same reason."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _properties(values: Mapping[str, object]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


_LOG4J = """status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class ApacheKafka:
    """One Apache Kafka (KRaft) node on loopback, data in `directory` (a new temporary one by default).

    `start()` blocks until the broker logged that it started (and, on plaintext, lists itself in its
    metadata) and returns the bootstrap; `stop()` stops it (SIGTERM, then SIGKILL after the grace
    period) and keeps the directory, so `start()` again is a restart with every topic and offset kept,
    on the same ports. `listeners`, `properties` and
    `format_args` let a caller (periscope.devkit.secure_kafka) add TLS, SASL and authorization.
    """

    profile = "kafka"

    def __init__(self, port: int = 0, host: str = "127.0.0.1", directory: str | Path | None = None, *,
                 heap_mb: int = _HEAP_MB, properties: Mapping[str, object] | None = None,
                 format_args: Sequence[str] = (), client_listener: str = "PLAINTEXT",
                 controller_listener: str = "PLAINTEXT", extra_listeners: Mapping[str, str] | None = None
                 ) -> None:
        self.host = host
        self.port = port
        self._controller_port = 0
        self._own_dir = directory is None
        self.directory = Path(directory) if directory is not None else Path(
            tempfile.mkdtemp(prefix="periscope-kafka-"))
        self.heap_mb = heap_mb
        self._extra = dict(properties or {})
        self._format_args = list(format_args)
        self._client_protocol = client_listener  # security protocol of the CLIENT listener
        self._controller_protocol = controller_listener
        self._extra_listeners = dict(extra_listeners or {})  # name -> security protocol, own free ports
        self.listener_ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    # ------------------------------------------------------------------ state

    @property
    def bootstrap(self) -> str:
        if self._proc is None:
            raise BrokerError("Apache Kafka is not running")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_status(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, max_bytes: int = 4000) -> str:
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(max(self._log_start, self.log_path.stat().st_size - max_bytes))
            return f.read().decode("utf-8", "replace").strip()

    # ------------------------------------------------------------------ lifecycle

    def _config(self) -> Path:
        self.port = self.port or free_port(self.host)
        self._controller_port = self._controller_port or free_port(self.host)
        for name in self._extra_listeners:
            self.listener_ports[name] = self.listener_ports.get(name) or free_port(self.host)
        listeners = {"CLIENT": self.port, **self.listener_ports, "CONTROLLER": self._controller_port}
        protocols = {"CLIENT": self._client_protocol, **self._extra_listeners,
                     "CONTROLLER": self._controller_protocol}
        values: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@{self.host}:{self._controller_port}",
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join(f"{n}://{self.host}:{p}" for n, p in listeners.items()),
            "advertised.listeners": ",".join(f"{n}://{self.host}:{p}" for n, p in listeners.items()
                                             if n != "CONTROLLER"),
            "listener.security.protocol.map": ",".join(f"{n}:{p}" for n, p in protocols.items()),
            "inter.broker.listener.name": "CLIENT",
            "log.dirs": self.directory / "data",
            # One node: every internal topic has one replica; few partitions keep the first group
            # coordination and the first transaction quick.
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 4,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            # Development stacks run short consumer-group sessions (a restarted worker is back quickly).
            "group.min.session.timeout.ms": 1000,
            # Topics are created by periscope.bus.admin with explicit settings, as in production.
            "auto.create.topics.enable": "false",
            "num.partitions": 1,
            # A small machine: few threads, a small cleaner buffer (the default 128 MiB is a third of
            # the heap), compaction checked every few seconds.
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            "log.cleaner.backoff.ms": 2000,
            **self._extra,
        }
        path = self.directory / "server.properties"
        path.write_text(_properties(values))
        (self.directory / "log4j2.properties").write_text(_LOG4J)
        return path

    def _java(self, libs: Path, main: str, *args: str, heap_mb: int) -> list[str]:
        java = shutil.which("java")
        assert java is not None  # distribution() checked it
        return [java, f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
                "-cp", f"{libs}/*", main, *args]

    def _format(self, libs: Path, config: Path) -> None:
        if (self.directory / "data" / "meta.properties").exists():
            return
        argv = self._java(libs, "kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(config),
                          *self._format_args, heap_mb=128)
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BrokerError(f"formatting Kafka storage in {self.directory} failed: "
                              + " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:]))

    def start(self, timeout_s: float = 60.0) -> str:
        if self._proc is not None:
            return self.bootstrap
        libs = distribution()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self._config()
        self._format(libs, config)
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            try:
                self._proc = spawn(self._java(libs, "kafka.Kafka", str(config), heap_mb=self.heap_mb),
                                   log.fileno())
            except OSError as e:
                raise BrokerError(f"cannot run java: {e}") from e
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout_s
        while not self._serving():
            if self._proc.poll() is not None:
                tail = self.log_tail()
                self._reap()
                raise BrokerError(f"Apache Kafka exited during start on {self.host}:{self.port}; "
                                  f"log {self.log_path}:\n{tail[-1500:]}")
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise BrokerError(f"Apache Kafka on {self.host}:{self.port} did not start within "
                                  f"{timeout_s:.0f}s; log {self.log_path}:\n{tail[-1500:]}")
            time.sleep(0.05)
        return self.bootstrap

    def _serving(self) -> bool:
        """The broker logged that it started and, on a plaintext client listener, its metadata lists
        it: "Kafka Server started" can come before the broker is registered, and a client that asks
        then gets metadata without brokers (aiokafka's admin client then fails with NodeNotReadyError)."""
        if not _READY.search(self.log_tail(1 << 20)):
            return False
        return self._client_protocol != "PLAINTEXT" or metadata_ready(self.host, self.port)

    def stop(self, grace_s: float = 10.0) -> None:
        proc = self._proc
        if proc is None:
            return
        stop_group(proc, grace_s)
        self._reap()
        atexit.unregister(self.stop)

    def kill(self) -> None:
        """SIGKILL, as a crash would: the directory stays for a restart."""
        if self._proc is not None:
            self._proc.kill()
            self._reap()
            atexit.unregister(self.stop)

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.wait()
            self._proc = None

    def remove(self) -> None:
        """Stop and delete the data directory when this object made it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()

