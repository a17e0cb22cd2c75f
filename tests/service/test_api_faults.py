"""Each error class has its answer: a store that is unavailable is a 503 problem
with Retry-After; a store that fails otherwise is a 500 problem whose text never
reaches the client; an unreadable tokens file fails closed (503), never open."""

from __future__ import annotations

import pytest

from api_support import bearer, client, make_app
from stepstream.api.tokens import add_token
from stepstream.errors import SinkError, SinkUnavailable
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore


class FailingSteps(MemoryStepStore):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def list_runs_page(self, company_id, *, limit=50, before=None, where=None):
        raise self.error


@pytest.mark.parametrize(
    "error, status, kind",
    [
        (SinkUnavailable("database is locked at /secret/path"), 503, "unavailable"),
        (SinkError("table steps: OverflowError at /secret/path"), 500, "internal"),
    ],
)
async def test_store_errors_are_problems(tmp_path, error, status, kind):
    token, _ = add_token(tmp_path / "t.json", "acme", ["steps:read"], created="x")
    async with client(make_app(FailingSteps(error), MemoryDeepStore(), tmp_path / "t.json")) as http:
        response = await http.get("/v1/companies/acme/runs", headers=bearer(token))
    assert response.status_code == status
    assert response.json()["type"] == f"urn:stepstream:problem:{kind}"
    assert "/secret/path" not in response.text
    assert ("retry-after" in response.headers) is (status == 503)


async def test_an_unreadable_tokens_file_fails_closed(tmp_path):
    path = tmp_path / "t.json"
    token, _ = add_token(path, "acme", ["steps:read"], created="x")
    async with client(make_app(MemoryStepStore(), MemoryDeepStore(), path)) as http:
        assert (await http.get("/v1/companies/acme/runs", headers=bearer(token))).status_code == 200
        path.write_text("{not json")
        refused = await http.get("/v1/companies/acme/runs", headers=bearer(token))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        path.unlink()
        assert (await http.get("/v1/companies/acme/runs", headers=bearer(token))).status_code == 401
