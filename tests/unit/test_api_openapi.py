"""``schemas/openapi.json`` is the document the API serves (regenerate with ``make schemas``)."""

from __future__ import annotations

import json
from pathlib import Path

from stepstream.schemagen import render_openapi

COMMITTED = Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"


def test_committed_openapi_matches_the_code():
    assert COMMITTED.read_text(encoding="utf-8") == render_openapi(), "run `make schemas`"


def test_openapi_has_exactly_the_contract_routes():
    paths = json.loads(render_openapi())["paths"]
    assert {(path, method) for path, ops in paths.items() for method in ops} == {
        ("/v1/companies/{company}/runs", "get"),
        ("/v1/companies/{company}/runs/{run_id}", "get"),
        ("/v1/companies/{company}/runs/{run_id}/deep", "get"),
        ("/v1/companies/{company}/runs/{run_id}/deep/{step_seq}", "get"),
        ("/v1/companies/{company}/runs/{run_id}/deep", "delete"),
        ("/v1/companies/{company}/deep", "delete"),
        ("/v1/companies/{company}/runs/{run_id}/trace.sftrace", "get"),
        ("/v1/companies/{company}/events", "post"),
        ("/v1/traces", "post"),
        ("/metrics", "get"),
        ("/healthz", "get"),
    }
    problem = json.loads(render_openapi())["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail"}
