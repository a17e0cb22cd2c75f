"""Canary secrets in tool arguments, outputs, thinking, state values, error messages
and a run's failure: no response of a steps route holds any of them (nor /metrics);
the deep route returns a run's canaries to a deep:read token of its company only."""

from __future__ import annotations

from datetime import timedelta

import pytest

from api_support import COMPANIES, T0, Tokens, all_canaries, bearer, canaries, client, corpus, load, make_app, run_events
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

FAILED_RUN = "run-failed"


def failure_canary(company: str) -> str:
    return f"sk-CANARYfailure{company}0123456789"


def failed_run(company: str) -> list[dict]:
    events = run_events(company, FAILED_RUN, T0 + timedelta(hours=1))
    events[-1]["payload"] = {"status": "failed", "failure": f"rejected {failure_canary(company)}"}
    return events


@pytest.fixture
async def api(tmp_path):
    steps, deep = MemoryStepStore(), MemoryDeepStore()
    await load(steps, deep, corpus() + [e for c in COMPANIES for e in failed_run(c)])
    tokens = Tokens(tmp_path / "tokens.json")
    async with client(make_app(steps, deep, tokens.path)) as http:
        yield http, tokens


def secrets() -> list[str]:
    return [*all_canaries(), *(failure_canary(c) for c in COMPANIES),
            *(v for c in COMPANIES for v in canaries(c, FAILED_RUN).values())]  # fmt: skip


async def test_steps_routes_never_carry_a_canary(api):
    http, tokens = api
    checked = 0
    for company in COMPANIES:
        headers = bearer(tokens[(company, "all")])
        listing = await http.get(f"/v1/companies/{company}/runs", params={"limit": 200}, headers=headers)
        assert listing.status_code == 200
        bodies = [listing.text]
        for run in listing.json()["runs"]:
            detail = await http.get(f"/v1/companies/{company}/runs/{run['run_id']}", headers=headers)
            assert detail.status_code == 200
            bodies.append(detail.text)
        for body in bodies:
            for secret in secrets():
                assert secret not in body
                checked += 1
        # The steps are there, redacted: the secret-bearing keys are present, masked.
        assert "[redacted]" in "".join(bodies) and '"api_key"' in "".join(bodies)
    assert checked > 0
    metrics = (await http.get("/metrics")).text
    assert not any(secret in metrics for secret in secrets())
    assert not any(company in metrics for company in COMPANIES) and "run-1" not in metrics


@pytest.mark.parametrize("run_id", ["run-1", "acme-only-1", "globex-only-0", FAILED_RUN])
async def test_deep_route_returns_canaries_to_deep_read_only(api, run_id):
    http, tokens = api
    company = "globex" if run_id.startswith("globex") else "acme"
    path = f"/v1/companies/{company}/runs/{run_id}/deep"
    mine = canaries(company, run_id).values()
    granted = await http.get(path, headers=bearer(tokens[(company, "deep")]))
    assert granted.status_code == 200
    assert all(c in granted.text for c in mine)
    others = [s for s in secrets() if s not in mine and not (run_id == FAILED_RUN and s == failure_canary(company))]
    assert not any(s in granted.text for s in others)
    for name in ("steps", "purge"):
        refused = await http.get(path, headers=bearer(tokens[(company, name)]))
        assert refused.status_code == 403 and not any(s in refused.text for s in secrets())
    other = "globex" if company == "acme" else "acme"
    foreign = await http.get(path, headers=bearer(tokens[(other, "all")]))
    assert foreign.status_code == 404 and not any(s in foreign.text for s in secrets())
