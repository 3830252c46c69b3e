"""Schema-driven HTTP test: requests generated from /openapi.json never get a 5xx, and every
documented response matches its documented shape (so /docs tells the truth)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from periscope.sim.apiserver import FakeApiServer
from periscope.sim.scenario import UserSpec
from services.api.app import create_app
from services.api.auth import Gate
from services.api.reviews import KubeReviews, kube_configuration
from tests.unit.test_api_samples import sample_view

schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(sample_view()))


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_no_server_errors_and_documented_shapes(case: schemathesis.Case) -> None:
    case.call_and_validate(
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ]
    )


# The same, with access control on: a namespace-scoped caller's token checked against the simulated
# apiserver over HTTP. 401/403/503 must be documented wherever they can be answered.
_apiserver = FakeApiServer(users=(UserSpec(name="alice", token="alice-token", namespaces=("infer",)),))


def _scoped_app() -> Any:
    _apiserver.start()
    kubeconfig = Path(tempfile.mkdtemp(prefix="periscope-schema-")) / "kubeconfig"
    reviews = KubeReviews(kube_configuration(str(_apiserver.write_kubeconfig(kubeconfig))))
    return create_app(sample_view(), gate=Gate(reviews))


scoped = schemathesis.openapi.from_asgi("/openapi.json", _scoped_app())


@scoped.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_no_server_errors_and_documented_shapes_with_a_token(case: schemathesis.Case) -> None:
    case.call_and_validate(
        headers={"Authorization": "Bearer alice-token"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
