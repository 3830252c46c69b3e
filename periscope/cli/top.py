"""`periscope top`: a live, kubectl-top-like table of GPUs and their owner pods, read from the API.

Each refresh reads /v1/gpus, /v1/pods?active=true and /v1/idle with the same filters; the table
itself is drawn by periscope.cli.top_table. With API access control on, the bearer token comes from
PERISCOPE_API_TOKEN (never echoed).

The API may not be what it claims, so a refresh is bounded: all three reads share one deadline
(`--timeout`; a server that trickles its answer a byte at a time cannot hold `top` past it), each
answer is read up to MAX_BODY bytes and no further, and what arrives is checked and made printable
by periscope.cli.top_answer before anything reaches the terminal. Any of these is one line, exit 1.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any
from urllib.parse import urlsplit

import click
import httpx
from rich.console import Console
from rich.live import Live

from periscope.cli.errors import InputError
from periscope.cli.terminal import shown
from periscope.cli.top_answer import BadAnswer, snapshot
from periscope.cli.top_table import SORTS, Snapshot, render_text, table
from periscope.settings.top import TopSettings

TOKEN_ENV = "PERISCOPE_API_TOKEN"
MAX_BODY = 32 * 1024 * 1024  # bytes per answer: a 10,000-GPU cluster's /v1/pods is a few MiB
_MIB = 1024 * 1024


class ApiUnreachable(click.ClickException):
    """The API could not be read: exit 1 (not bad input), one line."""

    exit_code = 1


def _api_base(url: str) -> str:
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.netloc) and url.isprintable()
        parts.port  # noqa: B018  (a port that is not a number, or out of range, raises)
    except ValueError:  # that, or a bad IPv6 literal
        ok = False
    if not ok:
        raise InputError(f"--api {shown(url)!r}: not an http(s) URL (e.g. http://127.0.0.1:8080)")
    return url.rstrip("/")


async def _body(r: httpx.Response, path: str) -> bytes:
    """The answer's bytes, never more than MAX_BODY of them (decompressed: a gzip bomb counts too)."""
    declared = r.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise ApiUnreachable(f"{path}: an answer of {int(declared) // _MIB} MiB is over the "
                             f"{MAX_BODY // _MIB} MiB limit")
    body = bytearray()
    async for chunk in r.aiter_bytes():
        body += chunk
        if len(body) > MAX_BODY:
            raise ApiUnreachable(f"{path}: an answer over the {MAX_BODY // _MIB} MiB limit")
    return bytes(body)


def _json(body: bytes, path: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the decoder's depth
        raise ApiUnreachable(f"{path}: the answer is not JSON (is --api the Periscope API?)") from None


async def _get(client: httpx.AsyncClient, path: str, params: dict[str, Any]) -> Any:
    try:
        async with client.stream("GET", path, params={k: v for k, v in params.items() if v is not None}) as r:
            body = await _body(r, path)
    except httpx.HTTPError as e:
        raise ApiUnreachable(f"cannot reach the API at {client.base_url}: {shown(e, 200)}") from None
    if r.status_code in (401, 403):
        hint = f"set {TOKEN_ENV}" if r.status_code == 401 else "the token may not read this"
        raise ApiUnreachable(f"{path}: HTTP {r.status_code} ({hint})")
    if r.status_code == 400:
        answer = _json(body, path)
        error = answer.get("error") if isinstance(answer, dict) else None
        raise InputError(f"{path}: {shown(error, 200) if isinstance(error, str) else 'bad request'}")
    if r.status_code != 200:
        raise ApiUnreachable(f"{path}: HTTP {r.status_code}")
    return _json(body, path)


async def _fetch(base: str, headers: dict[str, str], timeout_s: float, namespace: str | None,
                 node: str | None) -> Snapshot:
    try:
        async with asyncio.timeout(timeout_s), httpx.AsyncClient(
            base_url=base, headers=headers, timeout=timeout_s, follow_redirects=False
        ) as client:
            answers = {
                "/v1/gpus": await _get(client, "/v1/gpus", {"node": node}),
                "/v1/pods": await _get(client, "/v1/pods", {"active": "true", "namespace": namespace,
                                                            "node": node}),
                "/v1/idle": await _get(client, "/v1/idle", {"namespace": namespace, "node": node}),
            }
    except TimeoutError:
        raise ApiUnreachable(f"the API at {base} did not answer within {timeout_s:g}s (--timeout)") from None
    try:
        return snapshot(answers, namespace)
    except BadAnswer as e:
        raise ApiUnreachable(str(e)) from None


def fetch(base: str, headers: dict[str, str], timeout_s: float, namespace: str | None,
          node: str | None) -> Snapshot:
    """One refresh: the three answers, read within `timeout_s` in all, as a Snapshot."""
    return asyncio.run(_fetch(base, headers, timeout_s, namespace, node))


@click.command("top")
@click.option("--api", "api_url", default="http://127.0.0.1:8080", show_default=True, help="The API's URL.")
@click.option("--once", is_flag=True, help="Print one table and exit (for scripts).")
@click.option("--namespace", default=None, help="Only pods of this namespace.")
@click.option("--node", default=None, help="Only this node.")
@click.option(
    "--sort", type=click.Choice(SORTS), default=None, help="Order by utilization, idle waste or memory."
)
@click.option("--interval", type=click.FloatRange(0.2, 3600), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Seconds one refresh (all its reads together) may take.")
def command(
    api_url: str, once: bool, namespace: str | None, node: str | None, sort: str | None, interval: float,
    timeout_s: float,
) -> None:
    """A live table of GPUs and the pods holding them (Ctrl-C quits).

    With API access control on, the bearer token is read from PERISCOPE_API_TOKEN.
    """
    base = _api_base(api_url)
    token = TopSettings().api_token.get_secret_value()
    if not (token.isascii() and token.isprintable()):  # it goes into a header line; never echo it
        raise InputError(f"{TOKEN_ENV}: not a bearer token (it holds control or non-ASCII characters)")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if once:
        click.echo(render_text(fetch(base, headers, timeout_s, namespace, node), sort), nl=False)
        return
    # Ctrl-C is how a live table is meant to end, however the parent left SIGINT: a non-interactive shell
    # starts background jobs with it ignored, and Python then installs no handler of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:  # Ctrl-C: exit 0, the last table left on screen
        first = table(fetch(base, headers, timeout_s, namespace, node), sort)
        with Live(first, console=Console(), screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(table(fetch(base, headers, timeout_s, namespace, node), sort))
    except KeyboardInterrupt:
        return
