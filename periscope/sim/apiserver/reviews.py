"""The fake apiserver's TokenReview and SubjectAccessReview, for the scenario's `users:`.

Shapes are the real `authentication.k8s.io/v1` and `authorization.k8s.io/v1` ones, including their
awkward parts: a review is created with POST and answered with the same object plus `status`; a
TokenReview that does not authenticate omits `authenticated` and carries an empty `user` and an
`error`; an empty token is a 400; a SubjectAccessReview without a user or groups, or without exactly
one of resourceAttributes / nonResourceAttributes, is a 422 Invalid; a wrong kind is a 400.

Authorisation is a tiny RBAC holding the bindings `periscope up --apiserver kube` makes on a real
apiserver with the example roles of deploy/base/api-rbac.yaml: a `cluster: true` user
(periscope-cluster-viewer, cluster-wide) may get/list/watch pods in every namespace and get the
non-resource URLs /v1/policy and /metrics; a namespaced user (periscope-namespace-viewer, bound in each
of its namespaces) may get/list/watch pods there; nothing else is allowed.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any

from periscope.sim.apiserver.store import Obj, status
from periscope.sim.scenario.document import UserSpec

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
REVIEW_PATHS = {
    TOKEN_REVIEWS: ("authentication.k8s.io/v1", "TokenReview"),
    ACCESS_REVIEWS: ("authorization.k8s.io/v1", "SubjectAccessReview"),
}
_READ = ("get", "list", "watch")
_CLUSTER_URLS = ("/v1/policy", "/metrics")


def user_uid(name: str) -> str:
    return str(uuid.UUID(hashlib.sha256(f"user/{name}".encode()).hexdigest()[:32]))


def review(users: Sequence[UserSpec], path: str, body: Any) -> tuple[int, Obj]:
    """(HTTP status, response body) for a POST of `body` to one of REVIEW_PATHS."""
    api_version, kind = REVIEW_PATHS[path]
    if not isinstance(body, dict) or body.get("kind", kind) != kind:
        got = body.get("kind") if isinstance(body, dict) else type(body).__name__
        return 400, status(400, "BadRequest", f"the body of the request was of kind {got!r}, not {kind}")
    spec: Obj = body["spec"] if isinstance(body.get("spec"), dict) else {}
    out: Obj = {"kind": kind, "apiVersion": api_version, "metadata": body.get("metadata") or {}, "spec": spec}
    if kind == "TokenReview":
        token = spec.get("token")
        if not token:
            return 400, status(400, "BadRequest", "token is required for TokenReview in authentication")
        user = next((u for u in users if u.token == token), None)
        if user is None:
            out["status"] = {"user": {}, "error": "invalid bearer token"}
        else:
            groups = ["system:authenticated"]
            out["status"] = {"authenticated": True,
                             "user": {"username": user.name, "uid": user_uid(user.name), "groups": groups},
                             "audiences": spec.get("audiences") or ["https://kubernetes.default.svc"]}
        return 201, out
    invalid = _invalid_access(spec)
    if invalid:
        return 422, status(422, "Invalid", f"SubjectAccessReview.authorization.k8s.io is invalid: {invalid}")
    allowed, reason = _authorize(users, spec)
    out["status"] = {"allowed": allowed, **({"reason": reason} if reason else {})}
    return 201, out


def _invalid_access(spec: Obj) -> str:
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if (res is None) == (non is None):
        return ("spec.resourceAttributes: Invalid value: exactly one of nonResourceAttributes or "
                "resourceAttributes must be specified")
    if not spec.get("user") and not spec.get("groups"):
        return 'spec.user: Invalid value: "": at least one of user or group must be specified'
    return ""


def _authorize(users: Sequence[UserSpec], spec: Obj) -> tuple[bool, str]:
    user = next((u for u in users if u.name == spec.get("user")), None)
    if user is None:
        return False, ""
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    cluster_role = (f'ClusterRoleBinding "periscope-user-{user.name}" of ClusterRole '
                    '"periscope-cluster-viewer"')
    if non is not None:
        if user.cluster and non.get("verb") == "get" and non.get("path") in _CLUSTER_URLS:
            return True, f"RBAC: allowed by {cluster_role}"
        return False, ""
    res = res or {}
    pods = res.get("resource") == "pods" and not res.get("group") and not res.get("subresource")
    if not pods or res.get("verb") not in _READ:
        return False, ""
    if user.cluster:
        return True, f"RBAC: allowed by {cluster_role}"
    if (ns := res.get("namespace")) in user.namespaces:
        return True, (f'RBAC: allowed by RoleBinding "periscope-user-{user.name}/{ns}" of ClusterRole '
                      '"periscope-namespace-viewer"')
    return False, ""
