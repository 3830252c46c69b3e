"""Keyset pagination over the view's sorted key lists.

The `continue` token is opaque to clients: base64url JSON of the last key returned. The next page starts
strictly after that key, so rows added or removed between pages never shift or repeat the others.
"""

from __future__ import annotations

import base64
import binascii
import json
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

K = TypeVar("K", bound=tuple[Any, ...])
T = TypeVar("T")


MAX_TOKEN_CHARS = 4096  # a real token is a key of a few short strings; anything longer is not ours


class BadToken(ValueError):
    pass


def encode_token(kind: str, key: tuple[Any, ...]) -> str:
    raw = json.dumps([kind, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(kind: str, token: str, shape: tuple[type, ...]) -> tuple[Any, ...]:
    """Back to a key of the given element types; BadToken if it was not made by this endpoint."""
    if len(token) > MAX_TOKEN_CHARS:
        raise BadToken("invalid continue token (too long)")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):  # RecursionError: deeply nested JSON
        raise BadToken("invalid continue token") from None
    if not isinstance(data, list) or len(data) != len(shape) + 1 or data[0] != kind:
        raise BadToken("invalid continue token (it belongs to another listing)")
    values = data[1:]
    for v, t in zip(values, shape, strict=True):
        # bool is an int subclass in Python; a token never holds one.
        if not isinstance(v, t) or isinstance(v, bool):
            raise BadToken("invalid continue token")
    return tuple(values)


def page(
    keys: Sequence[K],
    after: K | None,
    limit: int | None,
    select: Callable[[K], T | None],
) -> tuple[list[T], K | None]:
    """Walk `keys` from just after `after`, keep what `select` returns (None = skip) up to `limit`.

    Returns the items and the key to continue after, or None when the listing is exhausted.
    """
    start = 0 if after is None else bisect_right(keys, after)
    items: list[T] = []
    for i in range(start, len(keys)):
        k = keys[i]
        item = select(k)
        if item is None:
            continue
        items.append(item)
        if limit is not None and len(items) >= limit:
            return items, (k if i + 1 < len(keys) else None)
    return items, None
