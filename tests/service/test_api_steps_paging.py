"""``GET .../runs/{run_id}`` pages the steps (issue 19, item 9): a cursor over
``step_seq`` (``?limit=&after=``, ``next_cursor``), a default and a maximum page,
every step exactly once across the pages, 400 on a bad limit or cursor."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stepstream.api.steps import DEFAULT_STEPS_LIMIT, MAX_STEPS_LIMIT
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore
from api_support import T0, bearer, client, load, make_app
from stepstream.api.tokens import add_token

STEPS = 450  # more than two maximum pages


def long_run() -> list[dict]:
    kinds = [("run_start", {"agent_name": "a"})] + [
        ("state_change", {"key": f"k{i}", "value": i}) for i in range(STEPS)
    ] + [("run_end", {"status": "completed"})]  # fmt: skip
    return [
        {"v": 1, "event_id": f"e{seq}", "company_id": "acme", "run_id": "long", "seq": seq,
         "ts": (T0 + timedelta(seconds=seq)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "type": kind, "payload": payload}
        for seq, (kind, payload) in enumerate(kinds)
    ]  # fmt: skip


class CountingSteps(MemoryStepStore):
    """Records the range of every step read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int | None, int | None, int]] = []

    async def get_steps(self, company_id, run_id, *, after=None, limit=None):
        rows = await super().get_steps(company_id, run_id, after=after, limit=limit)
        self.reads.append((after, limit, len(rows)))
        return rows


@pytest.fixture
async def api(tmp_path):
    steps, deep = CountingSteps(), MemoryDeepStore()
    await load(steps, deep, long_run())
    token, _ = add_token(tmp_path / "tokens.json", "acme", ["steps:read"], created="2026-11-29T12:00:00Z")
    async with client(make_app(steps, deep, tmp_path / "tokens.json")) as http:
        http.headers.update(bearer(token))
        yield http, steps


async def test_pages_return_every_step_exactly_once(api):
    http, store = api
    for limit in (1, 7, 100, MAX_STEPS_LIMIT):
        seen, after, pages = [], None, 0
        while True:
            params = {"limit": limit} if after is None else {"limit": limit, "after": after}
            body = (await http.get("/v1/companies/acme/runs/long", params=params)).json()
            assert len(body["steps"]) <= limit and body["run"]["step_count"] == STEPS
            seen += [s["step_seq"] for s in body["steps"]]
            pages += 1
            after = body["next_cursor"]
            if after is None:
                break
            assert after == str(body["steps"][-1]["step_seq"])
        assert seen == list(range(STEPS)), limit
        assert pages == -(-STEPS // limit)
    # Each read asked the store for one page (and one more row), never the whole run.
    assert store.reads and all(limit is not None and limit <= MAX_STEPS_LIMIT + 1 for _, limit, _ in store.reads)


async def test_the_default_page_and_the_cursor(api):
    http, _ = api
    body = (await http.get("/v1/companies/acme/runs/long")).json()
    assert [s["step_seq"] for s in body["steps"]] == list(range(DEFAULT_STEPS_LIMIT))
    assert body["next_cursor"] == str(DEFAULT_STEPS_LIMIT - 1)
    body = (await http.get("/v1/companies/acme/runs/long", params={"after": "440"})).json()
    assert [s["step_seq"] for s in body["steps"]] == list(range(441, STEPS)) and body["next_cursor"] is None
    body = (await http.get("/v1/companies/acme/runs/long", params={"after": "9999999"})).json()
    assert body["steps"] == [] and body["next_cursor"] is None


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": str(MAX_STEPS_LIMIT + 1)},
        {"limit": "ten"},
        {"after": "-1"},
        {"after": "abc"},
        {"after": "01"},
        {"after": "1\n"},
        {"after": ""},
        {"after": "1" * 17},
        {"before": "5"},
    ],
)
async def test_a_bad_limit_or_cursor_is_a_400_problem(api, params):
    http, _ = api
    answer = await http.get("/v1/companies/acme/runs/long", params=params)
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"] == "urn:stepstream:problem:bad-request"
