"""The live tail's stream (issue 24): a snapshot, the steps that changed (also a step
updated in place), keepalives, the end of a run, a revoked token ending an open
stream within a tick, the cap on a stream's life and on open streams."""

from __future__ import annotations

import asyncio

import msgspec

from api_support import Tokens, client
from stepstream.api.app import create_app
from stepstream.api.tokens import TokenRegistry, revoke_token, add_token
from stepstream.api.ui.live import LiveSettings
from stepstream.api.ui.session import COOKIE
from stepstream.core.records import RunRecord, StepRecord
from stepstream.metrics import ApiMetrics
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

FAST = LiveSettings(tick_seconds=0.02, keepalive_seconds=0.05, stream_seconds=0.4, max_streams=2)


def events(body: str) -> list[tuple[str, object]]:
    """``(name, data)`` per event; comments as ``(":", text)``."""
    found: list[tuple[str, object]] = []
    for block in body.split("\n\n"):
        if block.startswith(": "):
            found.append((":", block[2:]))
        elif block.startswith("event: "):
            name, data = block.split("\n", 1)
            found.append((name.removeprefix("event: "), msgspec.json.decode(data.removeprefix("data: "))))
    return found


async def running(steps: MemoryStepStore, **fields) -> RunRecord:
    run = RunRecord(company_id="acme", run_id="live", status="running", started_at="2026-11-29T12:00:00.000000Z", **fields)
    await steps.write([StepRecord(company_id="acme", run_id="live", step_seq=0, kind="tool", label="search",
                                  status="running", call_id="c1")], [run])  # fmt: skip
    return run


async def test_snapshot_changes_in_place_keepalive_and_the_life_cap(tmp_path):
    steps = MemoryStepStore()
    run = await running(steps)
    tokens = Tokens(tmp_path / "tokens.json")
    app = create_app(steps, MemoryDeepStore(), TokenRegistry(tokens.path), ApiMetrics(), live=FAST)

    async def writer():
        await asyncio.sleep(0.1)
        await steps.write([StepRecord(company_id="acme", run_id="live", step_seq=0, kind="tool", status="ok",
                                      output_shape="3 items")], [run])  # fmt: skip
        await asyncio.sleep(0.1)
        await steps.write([StepRecord(company_id="acme", run_id="live", step_seq=1, kind="llm", label="o/m")], [run])

    async with client(app) as http:
        task = asyncio.create_task(writer())
        answer = await http.get("/ui/companies/acme/runs/live/live", headers={"cookie": f"{COOKIE}={tokens['acme', 'steps']}"})
        await task
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    got = events(answer.text)
    names = [name for name, _ in got]
    assert names[0] == "snapshot" and [s["step_seq"] for s in got[0][1]["steps"]] == [0]
    changed = [data for name, data in got if name == "steps"]
    assert [[s["step_seq"] for s in d["steps"]] for d in changed] == [[0], [1]]  # step 0 again: filled in place
    assert changed[0]["steps"][0]["status"] == "ok" and changed[0]["steps"][0]["label"] == "search"
    assert ":" in names  # keepalives between events
    assert "end" not in names  # the life cap closed it: the browser reconnects


async def test_the_end_of_a_run_and_a_revoked_token_end_the_stream(tmp_path):
    steps = MemoryStepStore()
    run = await running(steps)
    path = tmp_path / "tokens.json"
    token, entry = add_token(path, "acme", ["steps:read"], created="2026-11-29T12:00:00Z")
    app = create_app(steps, MemoryDeepStore(), TokenRegistry(path), ApiMetrics(),
                     live=LiveSettings(tick_seconds=0.02, stream_seconds=30))  # fmt: skip
    cookie = {"cookie": f"{COOKIE}={token}"}
    async with client(app) as http:
        async def revoke():
            await asyncio.sleep(0.1)
            revoke_token(path, entry.id, revoked="2026-11-29T12:00:01Z")

        task = asyncio.create_task(revoke())
        answer = await asyncio.wait_for(http.get("/ui/companies/acme/runs/live/live", headers=cookie), 5)
        await task
        assert events(answer.text)[-1] == ("end", {"reason": "signed_out", "run": None, "steps": []})

        other, _ = add_token(path, "acme", ["steps:read"], created="2026-11-29T12:00:00Z")
        await steps.write([], [msgspec.structs.replace(run, status="completed", ended_at="2026-11-29T12:00:09.000000Z")])
        done = await asyncio.wait_for(http.get("/ui/companies/acme/runs/live/live", headers={"cookie": f"{COOKIE}={other}"}), 5)
        last = events(done.text)[-1]
        assert last[0] == "end" and last[1]["reason"] == "completed"


async def test_open_streams_are_bounded(tmp_path):
    steps = MemoryStepStore()
    await running(steps)
    tokens = Tokens(tmp_path / "tokens.json")
    app = create_app(steps, MemoryDeepStore(), TokenRegistry(tokens.path), ApiMetrics(), live=FAST)
    cookie = {"cookie": f"{COOKIE}={tokens['acme', 'steps']}"}
    async with client(app) as http:
        answers = await asyncio.gather(*(http.get("/ui/companies/acme/runs/live/live", headers=cookie) for _ in range(3)))
        assert sorted(a.status_code for a in answers) == [200, 200, 503]
        assert (await http.get("/ui/companies/acme/runs/live/live", headers=cookie)).status_code == 200  # given back
