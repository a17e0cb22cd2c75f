"""Hypothesis over company and run ids: ids that collide across companies and ids
with characters that need URL escaping. A token sees its own company's run and
nothing else; another company's run answers exactly like a missing one; an id
outside the contract's alphabet is refused (400 or 404), never a 5xx or data."""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepstream.api.app import create_app
from stepstream.api.tokens import TokenRegistry, add_token
from stepstream.core.records import RunRecord, StepRecord
from stepstream.metrics import ApiMetrics
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

PROPS = settings(max_examples=60, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
COMPANY_CHARS = "abcXYZ019._-"
RUN_CHARS = "abZ09._:-"
ESCAPING = " /%?#&+=;@[]\"'<>\\^`{|}~é\u00a0\u2028\U0001f600"
VALID_RUN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

companies = st.lists(st.text(COMPANY_CHARS, min_size=1, max_size=12), min_size=2, max_size=2, unique=True)
run_ids = st.lists(st.text(RUN_CHARS, min_size=1, max_size=16), min_size=1, max_size=5, unique=True)
odd_ids = st.text(RUN_CHARS + ESCAPING, min_size=1, max_size=16).filter(lambda s: not VALID_RUN.match(s))


def path(*segments: str) -> str:
    # Dots are escaped too, so that a "." or ".." id is not read as a path segment.
    return "/" + "/".join(quote(s, safe="").replace(".", "%2E") for s in segments)


def comparable(response: httpx.Response) -> tuple:
    return response.status_code, response.content, sorted((k, v) for k, v in response.headers.items() if k != "date")


async def scenario(tmp: Path, pair: list[str], shared: list[str], own: list[str], odd: str) -> None:
    a, b = pair
    steps = MemoryStepStore()
    for company in (a, b):
        for run_id in shared + [f"{r}{company}" for r in own]:
            marker = f"{company}|{run_id}"
            await steps.write(
                [StepRecord(company_id=company, run_id=run_id, step_seq=0, kind="tool", label=marker, status="ok")],
                [RunRecord(company_id=company, run_id=run_id, agent_name=marker, started_at="2026-11-29T12:00:00.000000Z")],
            )
    tokens = {c: add_token(tmp / "t.json", c, ["steps:read", "deep:read"], created="x")[0] for c in (a, b)}
    app = create_app(steps, MemoryDeepStore(), TokenRegistry(tmp / "t.json"), ApiMetrics())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:

        async def get(token_of: str, *segments: str) -> httpx.Response:
            return await http.get(path(*segments), headers={"Authorization": f"Bearer {tokens[token_of]}"})

        missing = await get(a, "v1", "companies", a, "runs", "no-such-run-" + "x" * 20)
        assert missing.status_code == 404
        for company, other in ((a, b), (b, a)):
            listing = await get(company, "v1", "companies", company, "runs")
            assert listing.status_code == 200
            assert {r["agent_name"] for r in listing.json()["runs"]} == {
                f"{company}|{r}" for r in shared + [f"{x}{company}" for x in own]
            }
            assert comparable(await get(other, "v1", "companies", company, "runs")) == comparable(missing)
            for run_id in shared + [f"{r}{company}" for r in own]:
                mine = await get(company, "v1", "companies", company, "runs", run_id)
                assert mine.status_code == 200, (run_id, mine.text)
                assert mine.json()["run"]["agent_name"] == f"{company}|{run_id}"
                assert [s["label"] for s in mine.json()["steps"]] == [f"{company}|{run_id}"]
                for route in ((), ("deep",)):
                    theirs = await get(other, "v1", "companies", company, "runs", run_id, *route)
                    assert comparable(theirs) == comparable(missing)
            for route in ((), ("deep",)):
                weird = await get(company, "v1", "companies", company, "runs", odd, *route)
                assert weird.status_code in (400, 404), (odd, weird.status_code)
                assert weird.headers["content-type"] == "application/problem+json"
                assert weird.json()["detail"] in ("not found", "invalid parameter: run_id")  # never the id


@PROPS
@given(pair=companies, shared=run_ids, own=run_ids, odd=odd_ids)
def test_ids_collide_and_escape_without_crossing_companies(pair, shared, own, odd):
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp), pair, shared, own, odd))
