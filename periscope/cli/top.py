"""`periscope top`: a live, kubectl-top-like table of GPUs and their owner pods, read from the API.

Each refresh reads /v1/gpus, /v1/pods?active=true and /v1/idle with the same filters; the table
itself is drawn by periscope.cli.top_table. With API access control on, the bearer token comes from
PERISCOPE_API_TOKEN (never echoed).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import click
import httpx
from rich.console import Console
from rich.live import Live

from periscope.cli.errors import InputError
from periscope.cli.top_table import SORTS, Snapshot, render_text, table
from periscope.settings.top import TopSettings

TOKEN_ENV = "PERISCOPE_API_TOKEN"


class ApiUnreachable(click.ClickException):
    """The API could not be read: exit 1 (not bad input), one line."""

    exit_code = 1


def _api_base(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"--api {url!r}: not an http(s) URL (e.g. http://127.0.0.1:8080)")
    return url.rstrip("/")


def _get(client: httpx.Client, path: str, params: dict[str, Any]) -> Any:
    try:
        r = client.get(path, params={k: v for k, v in params.items() if v is not None})
    except httpx.HTTPError as e:
        raise ApiUnreachable(f"cannot reach the API at {client.base_url}: {e}") from None
    if r.status_code in (401, 403):
        hint = f"set {TOKEN_ENV}" if r.status_code == 401 else "the token may not read this"
        raise ApiUnreachable(f"{path}: HTTP {r.status_code} ({hint})")
    if r.status_code == 400:
        raise InputError(f"{path}: {r.json().get('error', 'bad request')}")
    if r.status_code != 200:
        raise ApiUnreachable(f"{path}: HTTP {r.status_code}")
    return r.json()


def fetch(client: httpx.Client, namespace: str | None, node: str | None) -> Snapshot:
    gpus = _get(client, "/v1/gpus", {"node": node})
    pods = _get(client, "/v1/pods", {"active": "true", "namespace": namespace, "node": node})
    idle = _get(client, "/v1/idle", {"namespace": namespace, "node": node})
    if namespace is not None:  # only the GPUs this namespace's pods hold
        held = {p["gpu_uuid"] for p in pods["items"]}
        gpus["items"] = [g for g in gpus["items"] if g["gpu_uuid"] in held]
    return Snapshot(gpus["items"], pods["items"], idle["items"], pods.get("as_of"), namespace)


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
def command(
    api_url: str, once: bool, namespace: str | None, node: str | None, sort: str | None, interval: float
) -> None:
    """A live table of GPUs and the pods holding them (Ctrl-C quits).

    With API access control on, the bearer token is read from PERISCOPE_API_TOKEN.
    """
    base = _api_base(api_url)
    token = TopSettings().api_token.get_secret_value()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=base, headers=headers, timeout=10.0) as client:
        if once:
            click.echo(render_text(fetch(client, namespace, node), sort), nl=False)
            return
        try:  # Ctrl-C is how a live table is meant to end: exit 0, the last table left on screen
            with Live(table(fetch(client, namespace, node), sort), console=Console(), screen=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(table(fetch(client, namespace, node), sort))
        except KeyboardInterrupt:
            return
