"""Red-team cases for the command line: hostile or careless input ends in one line and exit 2 (or, for
an answer from outside, one line and exit 1), never a traceback, an "internal error", a hang or a
terminal left rewritten by someone else's escape sequences.

The file inputs (scenarios, checkpoints) are built here; `top` meets a hostile HTTP server and `doctor`
a hostile kubelet, /proc and NVML. Each case failed before its fix: deep YAML ended in a RecursionError,
a 400-digit duration in an OverflowError, out-of-range times reached the broker, a 32 MB checkpoint
took 28 s and 700 MB, `top` printed whatever the API sent and waited on a slow server forever.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from periscope.cli.main import main
from periscope.kubelet.checkpoint import MAX_CHECKPOINT_BYTES
from periscope.sim.scenario import load_scenario
from periscope.sim.scenario.loader import MAX_BYTES
from services.probe.checkpoint_source import CheckpointSource

SMALL = "duration: 30s\nnodes:\n  - name: n\n    gpus: [{model: T4, memory_mib: 15360}]\n"


# ---------------------------------------------------------------- running the CLI


def cli(*args: str | Path) -> tuple[int, str, str]:
    """`periscope ARGS` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return int(code or 0), out.getvalue(), err.getvalue()


def periscope(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "periscope.cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def clean(text: str) -> bool:
    """Nothing a terminal would act on: no escape, no control character but newline, no direction override."""
    overrides = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    return not any((ord(c) < 32 and c != "\n") or 0x7F <= ord(c) <= 0x9F or c in overrides for c in text)


def one_line(code: int, out: str, err: str, status: int = 2, *mentions: str) -> str:
    """Exit `status`, nothing on stdout, exactly one clean `periscope: ...` line on stderr."""
    assert code == status, (code, out[-500:], err[-2000:])
    assert out == ""
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("periscope: "), err[-2000:]
    assert len(lines[0]) < 400, lines[0]
    assert clean(lines[0]), repr(lines[0])
    for m in mentions:
        assert m in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_start(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """`periscope up` as far as its checks go: what it would start is recorded, nothing is started."""
    started: list[Any] = []

    def record(opts: Any, model: Any) -> int:
        started.append((opts, model))
        return 0

    monkeypatch.setattr("periscope.sim.cli.run_up", record)
    return started


# ---------------------------------------------------------------- scenario files


def _deep_block(depth: int) -> str:
    return "".join("  " * i + "a:\n" for i in range(depth)) + "  " * depth + "b: 1\n"


HOSTILE_SCENARIOS: dict[str, Callable[[], str]] = {
    "20,000-deep flow sequence": lambda: "nodes: " + "[" * 20_000 + "]" * 20_000 + "\n",
    "20,000-deep flow mapping": lambda: "nodes: " + "{a: " * 20_000 + "1" + "}" * 20_000 + "\n",
    "1,000-deep block mapping": lambda: _deep_block(1000),
    "alias expansion (billion laughs)": lambda: "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
    ) + "nodes: *i\n",
    "alias inside its own anchor": lambda: "nodes: &n [*n]\n",
    "larger than the file limit": lambda: "# " + "x" * (MAX_BYTES + 10) + "\n" + SMALL,
    "a 5000-digit integer": lambda: SMALL.replace("30s", "9" * 5000),
    "a 400-digit integer": lambda: SMALL.replace("30s", "9" * 400),
    "an infinite float": lambda: SMALL.replace("30s", "1.0e400"),
    "a date that does not exist": lambda: SMALL.replace("30s", "2021-13-45"),
    "a 400-digit duration": lambda: SMALL.replace("30s", "9" * 400 + "s"),
    "escape sequences in a name": lambda: SMALL.replace("name: n", 'name: "\\e[2J\\e]0;pwned\\a"'),
}


@pytest.mark.parametrize("case", list(HOSTILE_SCENARIOS))
def test_a_hostile_scenario_file_is_one_line_and_exit_2(case: str, tmp_path: Path,
                                                        no_start: list[Any]) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(HOSTILE_SCENARIOS[case]())
    started = time.monotonic()
    one_line(*cli("up", "--scenario", path), 2, f"scenario {path}")
    assert time.monotonic() - started < 20
    assert no_start == []


def test_the_file_limits_leave_room_for_real_scenarios(no_start: list[Any], tmp_path: Path) -> None:
    # 16 nodes and 2,000 pods: far more than the built-in scenarios, well inside every limit.
    nodes = "".join(f"  - {{name: n{i}, gpus: [{{model: T4, memory_mib: 15360}}]}}\n" for i in range(16))
    pods = "".join(f"  - {{namespace: ml, name: p{i}, node: n{i % 16}, start: {i // 16 * 300}ms, "
                   f"stop: {i // 16 * 300 + 300}ms, containers: [{{name: c, util_pct: 50}}]}}\n"
                   for i in range(2000))
    path = tmp_path / "large.yaml"
    path.write_text(f"duration: 40s\nnodes:\n{nodes}pods:\n{pods}")
    code, _, err = cli("up", "--scenario", path, "--api-port", "0", "--broker-port", "0")
    assert (code, err) == (0, ""), err
    assert len(no_start) == 1


# ---------------------------------------------------------------- scenario size (issue item 9)


def _nodes(n: int) -> str:
    return "duration: 30s\nnodes:\n" + "".join(
        f"  - {{name: n{i}, gpus: [{{model: T4, memory_mib: 15360}}]}}\n" for i in range(n))


def test_a_500_node_scenario_is_refused_before_anything_starts(tmp_path: Path,
                                                                no_start: list[Any]) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(_nodes(500))
    line = one_line(*cli("up", "--scenario", path, "--api-port", "0", "--broker-port", "0"), 2,
                    "500 nodes", "limit of 16", "--max-nodes 500")
    assert "probe process" in line  # what the limit protects
    assert no_start == []
    code, _, err = cli("up", "--scenario", path, "--api-port", "0", "--broker-port", "0",
                       "--max-nodes", "500", "--max-gpus", "500")
    assert (code, err) == (0, "") and len(no_start) == 1


def test_gpus_and_pods_have_limits_too(tmp_path: Path, no_start: list[Any]) -> None:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("duration: 30s\nnodes:\n  - name: n\n    gpus: [" + ", ".join(
        ["{model: T4, memory_mib: 15360}"] * 300) + "]\n")
    one_line(*cli("up", "--scenario", gpus, "--api-port", "0", "--broker-port", "0"), 2,
             "300 GPUs", "--max-gpus 300")
    pods = tmp_path / "pods.yaml"
    pods.write_text(SMALL + "pods:\n" + "".join(
        f"  - {{namespace: ml, name: p{i}, node: n, start: {i}s, stop: {i + 1}s, "
        "containers: [{name: c}]}\n" for i in range(10)))
    one_line(*cli("up", "--scenario", pods, "--api-port", "0", "--broker-port", "0", "--max-pods", "5"), 2,
             "10 pods", "--max-pods 10")
    assert no_start == []


# ---------------------------------------------------------------- relative paths (issue item 8)


def test_relative_scenario_and_truth_paths_are_resolved_before_children_start(
    tmp_path: Path, no_start: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "small.yaml").write_text(SMALL)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("up", "--scenario", "scenarios/small.yaml", "--truth", "truth.jsonl",
                       "--api-port", "0", "--broker-port", "0")
    assert (code, err) == (0, ""), err
    ((opts, model),) = no_start
    assert opts.truth == tmp_path / "truth.jsonl"
    scenario = model.scenario
    assert scenario.source == "scenarios/small.yaml"  # messages name the file as the user did
    assert scenario.location == str(tmp_path / "scenarios" / "small.yaml")
    monkeypatch.chdir("/")  # where a child process may run: the location still loads
    assert load_scenario(scenario.location).nodes == scenario.nodes
    assert load_scenario("demo").location == "demo"


# ---------------------------------------------------------------- durations and times (issue item 7)


@pytest.mark.parametrize("value", ["9" * 400, "9" * 400 + "s", "9" * 60 + "d", "36501d"])
def test_an_absurd_idle_window_is_one_line(value: str, no_start: list[Any]) -> None:
    one_line(*cli("up", "--idle-window", value, "--api-port", "0", "--broker-port", "0"), 2, "--idle-window")
    assert no_start == []


@pytest.mark.parametrize(
    "args",
    [
        ["--at", "9999-12-31T23:59:59-14:00"],
        ["--at", "0001-01-01T00:00:00+14:00"],
        ["--from", "0001-01-01T00:00:00+14:00", "--to", "2026-01-01T00:00:00Z"],
        ["--from", "2026-01-01T00:00:00Z", "--to", "9999-12-31T23:59:59-14:00"],
        ["--at", "2026-01-01T00:00:00Z", "--lookback", "9" * 400],
    ],
)
def test_replay_with_out_of_range_times_is_one_line_before_any_broker(args: list[str]) -> None:
    started = time.monotonic()
    # Port 9 (discard) refuses: had replay tried the broker, the line would say so.
    line = one_line(*cli("replay", "--bootstrap", "127.0.0.1:9", "-q", *args), 2)
    assert "broker" not in line and time.monotonic() - started < 10
    assert "out of range" in line or "not a duration" in line


# ---------------------------------------------------------------- checkpoints (issue item 11)


def _oversized_checkpoint(path: Path, size: int) -> None:
    with open(path, "wb") as f:  # a JSON array of numbers: parses, slowly, into a huge list
        f.write(b'{"Data":{"PodDeviceEntries":[')
        f.write(b"1," * ((size - 40) // 2))
        f.write(b'1],"RegisteredDevices":{}},"Checksum":1}')


def _max_rss_mib(*args: str | Path) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run `periscope ARGS` in a child and measure it: (result, peak resident MiB, seconds)."""
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
             "sys.exit(p.returncode)")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "periscope.cli.main",
                           *map(str, args)], capture_output=True, text=True, timeout=110)
    *lines, rss = proc.stderr.splitlines()
    proc.stderr = "".join(line + "\n" for line in lines)
    return proc, int(rss) / 1024, time.monotonic() - started


def test_inspect_refuses_a_32_mb_checkpoint_unread(tmp_path: Path) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    _oversized_checkpoint(path, 32 * 1024 * 1024)
    proc, rss, seconds = _max_rss_mib("inspect", "checkpoint", "--json", path)
    one_line(proc.returncode, proc.stdout, proc.stderr, 2, f"checkpoint {path}", "larger than 4 MiB")
    assert rss < 200 and seconds < 15, (rss, seconds)


def test_doctor_and_the_probe_refuse_a_400_mb_checkpoint_unread(tmp_path: Path) -> None:
    plugins = tmp_path / "var" / "lib" / "kubelet" / "device-plugins"
    plugins.mkdir(parents=True)
    checkpoint = plugins / "kubelet_internal_checkpoint"
    with open(checkpoint, "wb") as f:  # sparse: 400 MB that cost no disk
        f.truncate(400 * 1024 * 1024)
    proc, rss, seconds = _max_rss_mib("doctor", "--root", tmp_path, "--nvml-backend", f"fake:{tmp_path}/none")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("fail  checkpoint"))
    assert "400.0 MiB, larger than the 4 MiB" in line and "PERISCOPE_CHECKPOINT_PATH" in line
    assert rss < 200 and seconds < 30, (rss, seconds)
    entries, health = CheckpointSource(str(checkpoint)).read()
    assert entries == () and health.state == "corrupt" and "larger than" in health.detail


def test_a_checkpoint_just_under_the_limit_is_still_read(tmp_path: Path) -> None:
    from periscope.kubelet.checkpoint import CheckpointEntry, render_checkpoint

    entry = CheckpointEntry("5a1d7c3e-0b2f-4c6d-9e8f-1a2b3c4d5e6f", "c", "nvidia.com/gpu",
                            ("GPU-8a1b2c3d-0000-4000-8000-000000000000",))
    data = render_checkpoint([entry], {"nvidia.com/gpu": ["x" * (MAX_CHECKPOINT_BYTES - 400)]})
    assert MAX_CHECKPOINT_BYTES - 1000 < len(data) <= MAX_CHECKPOINT_BYTES
    path = tmp_path / "cp"
    path.write_bytes(data)
    entries, health = CheckpointSource(str(path)).read()
    assert health.state == "ok" and len(entries) == 1, health
    path.write_bytes(data + b" " * (MAX_CHECKPOINT_BYTES + 1 - len(data)))
    assert CheckpointSource(str(path)).read()[1].state == "corrupt"


def test_a_fifo_where_the_checkpoint_belongs_cannot_hang_the_probe(tmp_path: Path) -> None:
    fifo = tmp_path / "kubelet_internal_checkpoint"
    os.mkfifo(fifo)
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(CheckpointSource(str(fifo)).read()), daemon=True)
    worker.start()
    worker.join(5)
    assert result, "reading a FIFO checkpoint hung"
    assert result[0][1].state == "corrupt" and "not a regular file" in result[0][1].detail
    one_line(*cli("inspect", "cgroup", fifo), 2, "cgroup file")  # a FIFO nobody writes reads as empty


# ---------------------------------------------------------------- `top` against a hostile API


class HostileApi:
    """An HTTP server on loopback that answers every request with `answer(path, conn)`."""

    def __init__(self, answer: Callable[[str, socket.socket], None]) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            path = request.split(b" ", 2)[1].decode().split("?")[0]
            self.answer(path, conn)

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


Answer = Callable[[str, socket.socket], None]


def respond(body: bytes, status: str = "200 OK") -> Answer:
    def answer(path: str, conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
    return answer


def flood(declared: bool) -> Callable[[str, socket.socket], None]:
    def answer(path: str, conn: socket.socket) -> None:
        size = 100 * 1024 * 1024
        head = f"Content-Length: {size}\r\n" if declared else ""
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{head}Connection: close\r\n\r\n"
                     .encode())
        conn.sendall(b"[")
        block = b"1," * 32768
        for _ in range(size // len(block)):
            conn.sendall(block)
    return answer


def slow_loris(path: str, conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: ")
    for _ in range(600):  # a header byte every 0.2 s, for two minutes: each read sees data in time
        time.sleep(0.2)
        conn.sendall(b"a")


def listing(items: list[dict[str, Any]]) -> bytes:
    return json.dumps({"items": items, "as_of": "2026-11-22T04:05:06.789Z"}).encode()


EVIL = "\x1b[2J\x1b]0;pwned\x07\u202eevil\x9b1m[red]markup[/red]"
GPU = {"gpu_uuid": "GPU-" + EVIL, "node": "n" + EVIL, "index": 0, "util_pct": 5.0, "fb_used_mib": 1.0,
       "power_w": 60.0}
POD = {"pod_uid": "uid" + EVIL, "namespace": "ns" + EVIL, "pod": "pod" + EVIL, "container": "c" + EVIL,
       "node": "n" + EVIL, "device_id": "d" + EVIL, "gpu_uuid": "GPU-" + EVIL, "mig": None, "util_pct": 1.0,
       "fb_used_mib": 2.0, "power_w": 3.0}


def evil_api(path: str, conn: socket.socket) -> None:
    items = {"/v1/gpus": [GPU], "/v1/pods": [POD], "/v1/idle": [{"pod_uid": POD["pod_uid"],
                                                                   "device_id": POD["device_id"],
                                                                   "wasted_gpu_hours": 0.5}]}[path]
    respond(listing(items))(path, conn)


@contextlib.contextmanager
def api(answer: Callable[[str, socket.socket], None]) -> Iterator[str]:
    server = HostileApi(answer)
    try:
        yield server.url
    finally:
        server.close()


@pytest.mark.parametrize(
    ("answer", "mention"),
    [
        (respond(b"<html>not JSON at all</html>"), "not JSON"),
        (respond(b"\xff\xfe\x00garbage"), "not JSON"),
        (respond(b"[" * 200_000), "not JSON"),
        (respond(b'{"items": "everything"}'), "unexpected answer at items"),
        (respond(b'{"items": [{"gpu_uuid": 7, "node": "n"}]}'), "unexpected answer at items[0].gpu_uuid"),
        (respond(b'[1, 2, 3]'), "unexpected answer at the top"),
        (respond(b'{"items": [{"gpu_uuid": "g", "node": "n", "util_pct": NaN}]}'), "items[0].util_pct"),
        (flood(declared=True), "over the 32 MiB limit"),
        (flood(declared=False), "over the 32 MiB limit"),
        (slow_loris, "did not answer within 2s"),
        (respond(b"{}", "302 Found"), "HTTP 302"),
    ],
    ids=["html", "binary", "deep", "items-not-a-list", "wrong-type", "not-an-object", "nan", "flood-declared",
         "flood", "slow-loris", "redirect"],
)
def test_top_against_a_hostile_api_is_one_line_and_exit_1(answer: Callable[[str, socket.socket], None],
                                                          mention: str) -> None:
    with api(answer) as url:
        started = time.monotonic()
        proc = periscope("top", "--api", url, "--once", "--timeout", "2", timeout=60)
        seconds = time.monotonic() - started
    one_line(proc.returncode, proc.stdout, proc.stderr, 1, mention)
    assert seconds < 15, seconds


def test_top_prints_hostile_names_without_their_escape_sequences() -> None:
    with api(evil_api) as url:
        proc = periscope("top", "--api", url, "--once", "--timeout", "5")
    assert proc.returncode == 0, proc.stderr
    assert clean(proc.stdout), repr(proc.stdout)
    assert "[red]markup[/red]" in proc.stdout  # shown as text, not taken as rich markup
    assert "podevil" in proc.stdout


def test_a_400_answer_with_escape_sequences_is_one_clean_line() -> None:
    with api(respond(json.dumps({"error": "bad " + EVIL}).encode(), "400 Bad Request")) as url:
        proc = periscope("top", "--api", url, "--once", "--timeout", "5")
    one_line(proc.returncode, proc.stdout, proc.stderr, 2, "/v1/gpus: bad")


# ---------------------------------------------------------------- `doctor` against a hostile node


@pytest.fixture
def node_root() -> Iterator[Path]:
    """A node tree with a short path (a unix socket path has at most 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="ps-"))
    (root / "var" / "lib" / "kubelet" / "pod-resources").mkdir(parents=True)
    (root / "proc").mkdir()
    try:
        yield root
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def _hostile_kubelet(socket_path: Path) -> grpc.Server:
    from periscope.k8s.podresources.v1 import api_pb2_grpc as pb_grpc

    class Hostile(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
        def List(self, request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNKNOWN, "denied " + EVIL)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(Hostile(), server)
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    return server


def test_doctor_prints_a_hostile_kubelet_and_driver_without_their_escape_sequences(node_root: Path) -> None:
    server = _hostile_kubelet(node_root / "var" / "lib" / "kubelet" / "pod-resources" / "kubelet.sock")
    try:
        state = {"driver": "550" + EVIL, "gpus": [{"uuid": "GPU-1", "name": "A100" + EVIL, "index": 0}]}
        (node_root / "nvml.json").write_text(json.dumps(state))
        proc = periscope("doctor", "--root", node_root)
    finally:
        server.stop(None)
    assert proc.returncode == 1 and "internal error" not in proc.stderr, proc.stderr
    assert "List did not answer (UNKNOWN: denied" in proc.stdout
    assert clean(proc.stdout), repr(proc.stdout)


@pytest.mark.parametrize("content", [b"garbage{", b"[" * 100_000, b'{"gpus": [{"name": "no uuid"}]}'],
                         ids=["not-json", "deep", "no-uuid"])
def test_doctor_with_a_garbage_nvml_state_is_a_failed_check(node_root: Path, content: bytes) -> None:
    (node_root / "nvml.json").write_bytes(content)
    proc = periscope("doctor", "--root", node_root)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    assert any(line.startswith("fail  nvml.init") for line in proc.stdout.splitlines()), proc.stdout


def test_doctor_gives_up_on_a_source_that_never_answers(node_root: Path) -> None:
    (node_root / "proc" / "1").mkdir()
    os.mkfifo(node_root / "proc" / "1" / "comm")  # nobody ever writes: a plain read blocks for good
    started = time.monotonic()
    proc = periscope("doctor", "--root", node_root, "--nvml-backend", f"fake:{node_root}/none",
                     "--timeout", "3")
    one_line(proc.returncode, proc.stdout, proc.stderr, 1, "did not finish within 3s")
    assert time.monotonic() - started < 20
