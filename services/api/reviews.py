"""TokenReview and SubjectAccessReview calls to the Kubernetes apiserver.

The apiserver is found, and our own credentials taken, from the `kubernetes` client's configuration:
a kubeconfig when one is set, else the in-cluster service account (whose token is re-read through the
client's refresh hook, so a rotated token is picked up). The calls themselves go over an async HTTP
client so a review never blocks the event loop the API serves from. Any failure to get an answer
(unreachable, timeout, 5xx, our service account not allowed to create reviews) is `ReviewUnavailable`:
the caller answers 503 and never guesses.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

import httpx
from kubernetes import client as k8s
from kubernetes import config as k8s_config

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class ReviewUnavailable(Exception):
    """The apiserver could not answer a review; the message says why (without any token)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The user a TokenReview vouched for; what a SubjectAccessReview is asked about."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"user": self.username, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra}
        return out


def identity_of(user: dict[str, Any]) -> Identity:
    extra = user.get("extra") or {}
    return Identity(
        username=str(user.get("username") or ""),
        uid=str(user.get("uid") or ""),
        groups=tuple(str(g) for g in user.get("groups") or ()),
        extra=tuple(sorted((str(k), tuple(str(x) for x in v or ())) for k, v in extra.items())),
    )


def kube_configuration(kubeconfig: str = "") -> k8s.Configuration:
    """The client configuration: from `kubeconfig` when set, else in-cluster."""
    cfg = k8s.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        k8s_config.load_incluster_config(client_configuration=cfg)
    return cfg


def tls_context(cfg: k8s.Configuration) -> ssl.SSLContext:
    """The apiserver's CA, our client certificate if the kubeconfig has one, and its verify setting."""
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class KubeReviews:
    """Creates TokenReviews and SubjectAccessReviews on the apiserver `cfg` points at."""

    def __init__(self, cfg: k8s.Configuration, timeout_s: float = 5.0) -> None:
        self.cfg = cfg
        self.http = httpx.AsyncClient(base_url=cfg.host, verify=tls_context(cfg), timeout=timeout_s)

    async def close(self) -> None:
        await self.http.aclose()

    def _headers(self) -> dict[str, str]:
        # get_api_key_with_prefix runs the refresh hook the in-cluster loader installs (token rotation).
        auth = self.cfg.get_api_key_with_prefix("authorization") or self.cfg.get_api_key_with_prefix(
            "BearerToken"
        )
        return {"Authorization": auth} if auth else {}

    async def _create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = await self.http.post(path, json=body, headers=self._headers())
        except httpx.HTTPError as e:
            raise ReviewUnavailable(f"cannot reach the Kubernetes apiserver ({type(e).__name__})") from None
        if r.status_code in (401, 403):
            raise ReviewUnavailable(
                f"the apiserver refused our {body['kind']} (HTTP {r.status_code}): the API's service "
                "account needs create on tokenreviews and subjectaccessreviews"
            )
        if r.status_code >= 300:
            raise ReviewUnavailable(f"the apiserver answered {body['kind']} with HTTP {r.status_code}")
        try:
            out: dict[str, Any] = r.json()
        except ValueError:
            raise ReviewUnavailable(f"the apiserver's {body['kind']} answer is not JSON") from None
        return out

    async def authenticate(self, token: str) -> Identity | None:
        """The token's user, or None when the apiserver does not accept the token."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        status = (await self._create(TOKEN_REVIEWS, body)).get("status") or {}
        # `authenticated` is omitted when false; an empty username is no user either.
        if not status.get("authenticated") or not (status.get("user") or {}).get("username"):
            return None
        return identity_of(status["user"])

    async def authorize(self, who: Identity, attributes: dict[str, Any]) -> bool:
        """A SubjectAccessReview about `who`; `attributes` holds resourceAttributes or
        nonResourceAttributes."""
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {**who.spec(), **attributes},
        }
        status = (await self._create(ACCESS_REVIEWS, body)).get("status") or {}
        return bool(status.get("allowed")) and not status.get("denied")


def list_pods(namespace: str) -> dict[str, Any]:
    """`list pods` in `namespace`; "" asks about every namespace at once."""
    return {"resourceAttributes": {"namespace": namespace, "verb": "list", "group": "", "resource": "pods"}}


def get_url(path: str) -> dict[str, Any]:
    """`get` on a non-resource URL (how kube-rbac-proxy authorises /metrics)."""
    return {"nonResourceAttributes": {"path": path, "verb": "get"}}
