"""One running test control plane: the built program as a child that dies with its owner.

`ControlPlane(users).start()` writes the static token file (an administrator in `system:masters`
plus `users`), starts the program on loopback (through the development kit's launcher), reads what
it announces in its state directory (server URL, CA file, etcd client URL), then waits for the
apiserver's own /readyz, which includes the bootstrap RBAC roles. It hands out kubeconfigs and HTTP
clients for any of its tokens, and can force an etcd compaction through etcd's JSON gateway. The
static token file is read once at start: every user must be known before. `stop()` (or the owner
dying: PR_SET_PDEATHSIG) ends it; its state directory goes with it.
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from periscope.devkit.launch import spawn, stop_group
from periscope.sim.controlplane.build import ControlPlaneUnavailable, ensure_built

ADMIN = "periscope-admin"


@dataclass(frozen=True, slots=True)
class TokenUser:
    """One line of the static token file: `token,user,uid,"group,..."`."""

    token: str
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()

    def line(self) -> str:
        for text in (self.token, self.name, self.uid, *self.groups):
            if any(c in text for c in ',"\n'):
                raise ValueError(f"static token file fields cannot hold commas, quotes or newlines: {text!r}")
        groups = ",".join(self.groups)
        return f'{self.token},{self.name},{self.uid or self.name},"{groups}"'


def service_account_user(namespace: str, name: str, token: str | None = None) -> TokenUser:
    """A token for the identity a ServiceAccount's own token would have (same username and groups), so
    RBAC bound to the ServiceAccount applies to whoever presents it."""
    return TokenUser(
        token or secrets.token_hex(16),
        f"system:serviceaccount:{namespace}:{name}",
        groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
    )


@dataclass
class ControlPlane:
    users: Sequence[TokenUser] = ()
    runtime_config: str = ""  # e.g. "resource.k8s.io/v1=false,resource.k8s.io/v1beta1=true"
    authorization_mode: str = "Node,RBAC"  # RBAC alone where Node's own informers cannot run
    extra_args: Sequence[str] = ()  # more kube-apiserver flags; they win over ours
    ready_timeout_s: float = 120.0
    say: Callable[[str], None] | None = None
    admin: TokenUser = field(
        default_factory=lambda: TokenUser(secrets.token_hex(16), ADMIN, groups=("system:masters",))
    )
    server: str = ""
    ca_file: str = ""
    etcd: str = ""
    workdir: Path | None = None
    _proc: subprocess.Popen[bytes] | None = None
    _log: Path | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ControlPlane:
        binary = ensure_built(say=self.say)
        self.workdir = Path(tempfile.mkdtemp(prefix="periscope-controlplane-"))
        tokens = self.workdir / "tokens.csv"
        tokens.write_text("".join(u.line() + "\n" for u in (self.admin, *self.users)))
        tokens.chmod(0o600)
        argv = [str(binary), "--dir", str(self.workdir / "state"), "--token-file", str(tokens)]
        if self.runtime_config:
            argv += ["--runtime-config", self.runtime_config]
        argv += ["--authorization-mode", self.authorization_mode]
        if self.extra_args:
            argv += ["--", *self.extra_args]
        self._log = self.workdir / "controlplane.log"
        with open(self._log, "wb") as log:
            self._proc = spawn(argv, log.fileno())
        try:
            self._announced()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _announced(self, timeout_s: float = 60.0) -> None:
        assert self.workdir is not None
        announced = self.workdir / "state" / "controlplane.json"
        deadline = time.monotonic() + timeout_s
        while not announced.exists():
            if self._proc is None or self._proc.poll() is not None or time.monotonic() > deadline:
                raise ControlPlaneUnavailable(f"the control plane did not start: {self.log_tail()}")
            time.sleep(0.05)
        info = json.loads(announced.read_text())
        self.server, self.ca_file, self.etcd = info["server"], info["ca"], info["etcd"]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        last = ""
        with self.http() as client:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.poll() is not None:
                    raise ControlPlaneUnavailable(
                        f"the control plane exited ({self._proc.returncode}): {self.log_tail()}"
                    )
                try:
                    r = client.get("/readyz", params={"verbose": "true"})
                    if r.status_code == 200:
                        return
                    failing = [
                        line[3:].split(" ")[0] for line in r.text.splitlines() if line.startswith("[-]")
                    ]
                    last = f"/readyz {r.status_code}: failing {', '.join(failing) or '?'}"
                except httpx.HTTPError as e:
                    last = type(e).__name__
                time.sleep(0.2)
        raise ControlPlaneUnavailable(
            f"the control plane was not ready in {self.ready_timeout_s:g}s ({last})"
        )

    def log_tail(self, lines: int = 5) -> str:
        if self._log is None or not self._log.exists():
            return "(no log)"
        text = self._log.read_text(errors="replace").strip().splitlines()
        # The apiserver's own lines say why; etcd's JSON lines as it shuts down after it say little.
        own = [line for line in text if not line.startswith("{")]
        return " | ".join((own or text)[-lines:]) or "(empty log)"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace_s: float = 3.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, grace_s)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ clients

    def http(self, token: str | None = None, timeout_s: float = 30.0) -> httpx.Client:
        """An HTTP client for the apiserver as the holder of `token` (default: the administrator)."""
        auth = {"Authorization": f"Bearer {token or self.admin.token}"}
        return httpx.Client(base_url=self.server, verify=self.ca_file, headers=auth, timeout=timeout_s)

    def impersonating(self, user: str, groups: Sequence[str] = ()) -> httpx.Client:
        """The administrator acting as `user` (`kubectl --as`): the apiserver authorizes every request
        as that user. For a ServiceAccount's username it adds the ServiceAccount groups itself."""
        headers = httpx.Headers(
            [
                ("Authorization", f"Bearer {self.admin.token}"),
                ("Impersonate-User", user),
                *(("Impersonate-Group", g) for g in groups),
            ]
        )
        return httpx.Client(base_url=self.server, verify=self.ca_file, headers=headers, timeout=30.0)

    def write_kubeconfig(self, path: str | Path, token: str | None = None) -> Path:
        return write_kubeconfig(path, self.server, self.ca_file, token or self.admin.token)

    # ------------------------------------------------------------------ etcd

    def revision(self) -> int:
        """etcd's current revision: the newest resourceVersion any object can have."""
        key = base64.b64encode(b"/registry/").decode()
        r = httpx.post(f"{self.etcd}/v3/kv/range", json={"key": key, "count_only": True}, timeout=10)
        r.raise_for_status()
        return int(r.json()["header"]["revision"])

    def compact(self) -> int:
        """Compact etcd up to its current revision (as the apiserver's own compactor does every few
        minutes): every older resourceVersion is gone, and a watch from one that reaches etcd gets 410."""
        rev = self.revision()
        r = httpx.post(
            f"{self.etcd}/v3/kv/compaction", json={"revision": str(rev), "physical": True}, timeout=30
        )
        if r.status_code != 200 and "required revision has been compacted" not in r.text:
            r.raise_for_status()
        return rev


def write_kubeconfig(
    path: str | Path, server: str, ca_file: str, token: str, context: str = "periscope-kube"
) -> Path:
    """A kubeconfig for `server` as the holder of `token` (readable by its owner only)."""
    cfg: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": context,
        "preferences": {},
        "clusters": [{"name": context, "cluster": {"server": server, "certificate-authority": ca_file}}],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
    }
    out = Path(path)
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out.chmod(0o600)
    return out
