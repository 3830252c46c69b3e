"""Chunked lists (`limit` / `continue`) as the apiserver serves them: a consistent snapshot.

The apiserver answers `?limit=N` with at most N items, a `metadata.continue` token while more remain,
and `metadata.remainingItemCount`; every later page comes from the same snapshot (the first page's
resourceVersion), whatever changed since. Once that version is compacted away, a `continue` gets
410 Expired and the client must list afresh. `Pages` keeps the rest of each snapshot under its token
(the token, opaque to clients as the real one is, encodes the list and its version, so a malformed one
is a 400 and a forgotten one a 410), bounded, and expires it with the store's compaction floor.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter."
)


class ContinueExpired(Exception):
    """The token's snapshot is older than the compaction floor (or unknown): HTTP 410 Expired."""


class BadContinue(Exception):
    """The token was not made for this list: HTTP 400 BadRequest, as a malformed token is."""


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Obj]
    resource_version: int
    token: str  # "" on the last page
    remaining: int

    def metadata(self) -> Obj:
        meta: Obj = {"resourceVersion": str(self.resource_version)}
        if self.token:
            meta["continue"] = self.token
            meta["remainingItemCount"] = self.remaining
        return meta


class Pages:
    max_snapshots = 256  # open chunked lists kept; the oldest is forgotten first

    def __init__(self) -> None:
        self._rest: OrderedDict[str, list[Obj]] = OrderedDict()

    def first(self, scope: str, items: list[Obj], rv: int, limit: int) -> Page:
        """The first page of `items` (the list at `rv`); `scope` names the list (kind and namespace)."""
        return self._page(scope, items, rv, limit)

    def next(self, scope: str, token: str, limit: int, floor: int) -> Page:
        try:
            key = json.loads(base64.urlsafe_b64decode(token.encode()))
            made_for, rv = str(key["scope"]), int(key["rv"])
        except (ValueError, TypeError, KeyError, binascii.Error):
            raise BadContinue("continue key is not valid: incorrect encoded start resourceVersion") from None
        if made_for != scope:
            raise BadContinue("continue key is not valid for this list")
        rest = self._rest.pop(token, None)
        if rest is None or rv < floor:
            raise ContinueExpired(CONTINUE_EXPIRED)
        return self._page(scope, rest, rv, limit)

    def _page(self, scope: str, items: list[Obj], rv: int, limit: int) -> Page:
        if limit <= 0 or len(items) <= limit:
            return Page(items, rv, "", 0)
        key = {"scope": scope, "rv": rv, "id": secrets.token_hex(8)}
        token = base64.urlsafe_b64encode(json.dumps(key).encode()).decode()
        self._rest[token] = items[limit:]
        while len(self._rest) > self.max_snapshots:
            self._rest.popitem(last=False)
        return Page(items[:limit], rv, token, len(items) - limit)
