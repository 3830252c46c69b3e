"""Schema-driven HTTP test: requests generated from /openapi.json never get a 5xx, and every
documented response matches its documented shape (so /docs tells the truth)."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.api.app import create_app
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
