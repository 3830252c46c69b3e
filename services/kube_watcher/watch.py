"""List-then-watch of one apiserver resource with the official client, in a thread of its own.

The client is blocking, so each resource runs here, off the event loop, and hands plain-dict
notifications to a callback. Protocol rules kept here: resume a dropped watch from the last
resourceVersion (events or BOOKMARKs), relist on 410 Gone (HTTP or an ERROR event), back off on
connection errors, and report "not served" (404: no CRD, no API group) instead of failing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from periscope.bus.retry import Backoff

log = logging.getLogger(__name__)
Obj = dict[str, Any]
ListFn = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Listed:
    """A complete list of the resource (initial or after 410): a snapshot to converge on."""

    kind: str
    items: tuple[Obj, ...]
    resource_version: str


@dataclass(frozen=True, slots=True)
class Changed:
    kind: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj


@dataclass(frozen=True, slots=True)
class Unavailable:
    """The apiserver refused the resource: 404 = not served (no CRD / API group), else an error."""

    kind: str
    status: int
    detail: str


Notification = Listed | Changed | Unavailable


@dataclass(slots=True)
class WatchStats:
    lists: int = 0
    pages: int = 0  # list requests: a list of many objects comes in pages of `page_size`
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0  # 410 Gone -> relist
    errors: int = 0


class _Expired(Exception):
    pass


class ResourceWatch:
    """Run with `run()` in a thread; `stop()` from any thread interrupts a blocked read."""

    def __init__(
        self,
        kind: str,
        list_fn: ListFn,
        notify: Callable[[Notification], None],
        *,
        watch_timeout_s: int = 300,
        request_timeout_s: float = 30.0,
        unavailable_retry_s: float = 30.0,
        page_size: int = 500,
        backoff: Backoff | None = None,
        after: Sequence[threading.Event] = (),
        after_timeout_s: float = 10.0,
    ) -> None:
        self.kind = kind
        self._list_fn = list_fn
        self._notify = notify
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.unavailable_retry_s = unavailable_retry_s
        self._said_not_served = False
        self.page_size = page_size
        self._backoff = backoff or Backoff(max_s=30.0)  # the apiserver asks clients to back off long
        self._after = after
        self._after_timeout_s = after_timeout_s
        self._stop = threading.Event()
        self._resp: Any = None
        self.synced = threading.Event()  # first list answered (or the resource is unavailable)
        self.stats = WatchStats()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # already closed
                resp.shutdown()  # unblocks a thread sitting in a socket read

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        for event in self._after:  # e.g. list nodes before pods, so GPU nodes are known
            event.wait(self._after_timeout_s)
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                rv = self._watch(rv)
            except _Expired:
                self.stats.expired += 1
                log.info("%s: resourceVersion expired (410), relisting", self.kind)
                rv = None
            except ApiException as exc:
                if exc.status == 410:
                    self.stats.expired += 1
                    rv = None
                    continue
                self.stats.errors += 1
                detail = f"{exc.status} {exc.reason or ''}".strip()
                if exc.status != 404:
                    log.warning("%s: apiserver answered %s", self.kind, detail)
                elif not self._said_not_served:  # an optional CRD a cluster may lack: once, not every retry
                    self._said_not_served = True
                    log.info("%s: not served by this apiserver (%s); asking again every %.0fs",
                             self.kind, detail, self.unavailable_retry_s)
                self._notify(Unavailable(self.kind, int(exc.status or 0), detail))
                self.synced.set()
                rv = None
                self._stop.wait(self.unavailable_retry_s if exc.status == 404 else self._backoff.next())
            except Exception as exc:  # connection refused/reset, truncated stream, bad JSON
                if self._stop.is_set():  # stop() shut the socket under us
                    break
                self.stats.errors += 1
                delay = self._backoff.next()
                log.info("%s: %s: %s; retrying in %.1fs", self.kind, type(exc).__name__, exc, delay)
                self._stop.wait(delay)

    def _list(self) -> str:
        items: list[Obj] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size}
            if token:
                kwargs["_continue"] = token
            resp = self._list_fn(
                _preload_content=False, _request_timeout=(5, self.request_timeout_s), **kwargs
            )
            try:
                data = json.loads(resp.data)
            finally:
                resp.release_conn()
            self.stats.pages += 1
            items += [_trim(o) for o in data.get("items") or ()]
            meta = data.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        rv = str(meta.get("resourceVersion") or "")
        self.stats.lists += 1
        self._notify(Listed(self.kind, tuple(items), rv))
        self.synced.set()
        self._backoff.reset()
        return rv

    def _watch(self, rv: str) -> str:
        started, seen = time.monotonic(), 0
        resp = self._list_fn(
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            _request_timeout=(5, self.watch_timeout_s + 30),
        )
        self._resp = resp
        self.stats.watches += 1
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                typ, obj = event.get("type"), event.get("object") or {}
                if typ == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise ApiException(
                        status=obj.get("code") or 500, reason=obj.get("message") or "watch error"
                    )
                seen += 1
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if typ == "BOOKMARK":
                    self.stats.bookmarks += 1
                elif typ in ("ADDED", "MODIFIED", "DELETED"):
                    self.stats.events += 1
                    self._notify(Changed(self.kind, typ, _trim(obj)))
                self._backoff.reset()
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        if not seen and time.monotonic() - started < 1.0 and not self._stop.is_set():
            self._stop.wait(self._backoff.next())  # a server that hangs up at once: do not spin
        return rv


def _trim(obj: Obj) -> Obj:
    (obj.get("metadata") or {}).pop("managedFields", None)  # large and never needed here
    return obj
