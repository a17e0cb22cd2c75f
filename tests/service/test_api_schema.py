"""Schemathesis against the API's own /openapi.json: no 5xx, and every response
(status, content type, headers, body) matches the schema, for anonymous callers
and for a token of one company with every scope, over the real engine's rows.
Bounded: a fixed number of examples per operation (~10 s in all)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance
from hypothesis import HealthCheck, settings
from prometheus_client import generate_latest

from api_support import Tokens, corpus, load, make_app
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

EXAMPLES = 40


def serve():
    """The app over the memory stores, loaded through the real engine (at collection:
    Schemathesis needs the schema before the tests are generated)."""
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    asyncio.run(load(steps, deep, corpus()))
    tokens = Tokens(Path(tempfile.mkdtemp(prefix="stepstream-schema-")) / "tokens.json")
    return make_app(steps, deep, tokens.path), tokens


APP, TOKENS = serve()
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
# The same operations on ids that exist, so that the 200 answers are checked too.
known_ids = schemathesis.openapi.from_asgi(
    "/openapi.json",
    APP,
    config=SchemathesisConfig.from_dict({"parameters": {"path.company": "acme", "path.run_id": "run-2"}}),
)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, print_blob=True, suppress_health_check=list(HealthCheck))
def test_every_operation_conforms(case):
    conforms(case, known=False)


def conforms(case, known):
    headers = {"Authorization": f"Bearer {TOKENS[('acme', 'all')]}"} if case.operation.path.startswith("/v1") else {}
    # A cursor is opaque: the schema can say its alphabet, not which strings the API
    # made, so a schema-valid ``before`` may rightly be a 400 (documented on the route).
    opaque = case.operation.path.endswith("/runs") and "before" in (case.query or {})
    # The bundle of a known run is a 410 once the fuzzed purge routes destroyed its
    # bodies (state, not the request: documented on the route).
    bundle = case.operation.path.endswith("/trace.sftrace")
    excluded = [positive_data_acceptance] if opaque or bundle else []
    # The test sends the token itself, so a case made negative by its headers (no or a
    # bad Authorization) is sent with a valid one: what the server gets is not that
    # negative case, and "accepted" says nothing (its other mutations may be ones
    # Schemathesis exempts alone, such as an extra query parameter left unsent).
    generated = case.meta.components.get(ParameterLocation.HEADER) if case.meta else None
    if headers and generated is not None and generated.mode.is_negative:
        excluded.append(negative_data_rejection)
    # Likewise on the known-ids pass a path made negative is sent with the known ids the
    # config pins (company acme, run run-2), so "accepted" says nothing about it.
    in_path = case.meta.components.get(ParameterLocation.PATH) if case.meta else None
    if known and in_path is not None and in_path.mode.is_negative:
        excluded.append(negative_data_rejection)
    case.call_and_validate(headers=headers, excluded_checks=excluded or None)


@known_ids.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, print_blob=True, suppress_health_check=list(HealthCheck))
def test_every_operation_conforms_on_known_ids(case):
    conforms(case, known=True)


def test_the_fuzzing_reached_every_route_with_data():
    """Runs after the two above (file order): the known-ids pass got 200 answers with
    data on every /v1 route, so the response schemas were checked on real bodies."""
    from prometheus_client.parser import text_string_to_metric_families

    answered = {
        (s.labels["method"], s.labels["route"])
        for family in text_string_to_metric_families(generate_latest(APP.metrics.registry).decode())
        for s in family.samples
        if s.name == "stepstream_api_requests_total" and s.labels["status"] == "200" and s.value > 0
    }
    assert answered >= {
        ("GET", "/v1/companies/{company}/runs"),
        ("GET", "/v1/companies/{company}/runs/{run_id}"),
        ("GET", "/v1/companies/{company}/runs/{run_id}/deep"),
        ("GET", "/v1/companies/{company}/runs/{run_id}/deep/{step_seq}"),
        ("DELETE", "/v1/companies/{company}/runs/{run_id}/deep"),
        ("DELETE", "/v1/companies/{company}/deep"),
    }
