"""``GET /v1/companies/{company}/runs`` filters (issue 24): ``status``, ``agent``,
``since`` / ``until`` and ``problems``, applied by the store query (the conformance
suite holds every backend to it), combined with the cursor, and 400 on a bad value."""

from __future__ import annotations

import pytest

from api_support import Tokens, bearer, client, make_app
from stepstream.core.records import RunRecord
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore


def at(minute: int) -> str:
    return f"2026-11-29T12:{minute:02d}:00.000000Z"


async def test_filters_narrow_the_listing_and_page_through_it(tmp_path):
    steps = MemoryStepStore()
    await steps.write(
        [],
        [
            RunRecord(company_id="acme", run_id=f"r{i}", status="failed" if i % 3 == 0 else "completed",
                      agent_name="a" if i % 2 else "b", started_at=at(i), seq_gaps=1 if i == 4 else 0)
            for i in range(10)
        ],  # fmt: skip
    )
    tokens = Tokens(tmp_path / "tokens.json")
    async with client(make_app(steps, MemoryDeepStore(), tokens.path)) as http:
        auth = bearer(tokens["acme", "steps"])

        async def ids(query: str) -> list[str]:
            seen, cursor = [], ""
            while True:
                answer = await http.get(f"/v1/companies/acme/runs?limit=2&{query}{cursor}", headers=auth)
                assert answer.status_code == 200, answer.text
                body = answer.json()
                seen += [r["run_id"] for r in body["runs"]]
                if body["next_cursor"] is None:
                    return seen
                cursor = f"&before={body['next_cursor']}"

        assert await ids("status=failed") == ["r9", "r6", "r3", "r0"]
        assert await ids("agent=a") == ["r9", "r7", "r5", "r3", "r1"]
        assert await ids("problems=true") == ["r9", "r6", "r4", "r3", "r0"]
        assert await ids("since=2026-11-29T12:03:00Z&until=2026-11-29T13:06:00%2B01:00") == ["r5", "r4", "r3"]
        assert await ids("since=2026-11-29T12:08:00") == ["r9", "r8"]  # no offset: UTC
        assert await ids("status=completed&agent=b&problems=true") == ["r4"]
        # Outside the event window: clamped to it (no run is outside it), not refused.
        assert await ids("since=0001-01-01T00:00:00%2B01:00&until=2026-11-29T12:01:00Z") == ["r0"]


@pytest.mark.parametrize(
    "query",
    ["status=done", "since=yesterday", "until=2026-13-01T00:00:00Z", "problems=maybe", "agent=", "since=" + "9" * 41],
)
async def test_a_bad_filter_is_a_400_that_does_not_echo_it(tmp_path, query):
    tokens = Tokens(tmp_path / "tokens.json")
    async with client(make_app(MemoryStepStore(), MemoryDeepStore(), tokens.path)) as http:
        answer = await http.get(f"/v1/companies/acme/runs?{query}", headers=bearer(tokens["acme", "steps"]))
        assert answer.status_code == 400
        value = query.partition("=")[2]
        assert not value or value not in answer.text
