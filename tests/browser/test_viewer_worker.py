"""The live tail of a run driven through the real worker on the real broker (issue 24):
each new step shows on the open page within 2 s of its write to the store, and a late
event (a result that arrives after a later call) fills its step in place.

Needs the broker `make test` starts (``STEPSTREAM_TEST_BROKER``); without it the test
fails, it never skips. The worker writes SQLite; the API reads the same file."""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # harness: the worker process

from browser_support import ViewerServer, Watched  # noqa: E402
from harness import Scenario  # noqa: E402
from stepstream.api.tokens import add_token  # noqa: E402
from stepstream.api.ui.live import LiveSettings  # noqa: E402
from stepstream.core import wire  # noqa: E402
from stepstream.sinks import open_deep_store, open_step_store  # noqa: E402

pytestmark = pytest.mark.integration

WITHIN = 2.0  # seconds from the write of a step to the page showing it
T0 = datetime.now(timezone.utc).replace(microsecond=0)
PAYLOADS = {t.__struct_config__.tag: t for t in wire.EVENT_TYPES}


def event(kind: str, seq: int, **payload: Any) -> wire.Event:
    cls = PAYLOADS[kind]
    payload_cls = getattr(wire, cls.__annotations__["payload"])
    return cls(v=1, event_id=f"live-{seq}", company_id="acme", run_id="live-run", seq=seq,
               ts=T0 + timedelta(seconds=seq), payload=payload_cls(**payload))  # fmt: skip


def broker() -> str:
    value = os.environ.get("STEPSTREAM_TEST_BROKER", "").strip()
    if not value:
        pytest.fail("STEPSTREAM_TEST_BROKER is not set: run with `make test` (it starts the broker)", pytrace=False)
    return value


def test_the_live_tail_follows_the_worker(watched, tmp_path):
    scenario = Scenario(broker(), tmp_path, partitions=1)

    async def stores():
        return await open_step_store(scenario.steps_url), await open_deep_store(scenario.deep_url)

    token, _ = add_token(tmp_path / "tokens.json", "acme", ["steps:read"], created="2026-11-29T12:00:00Z")
    # Playwright's loop runs in this thread: every coroutine goes to the server's loop.
    with ViewerServer(stores, tmp_path / "tokens.json", live=LiveSettings(tick_seconds=0.25)) as server:
        server.call(scenario.create_topics())
        worker = scenario.start_worker()
        try:
            worker.wait_web()

            def produce(*events: wire.Event) -> None:
                server.call(scenario.produce(list(events)))

            def written(predicate, what: str, timeout: float = 60.0) -> float:
                """The time the store first holds what ``predicate`` looks for."""
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    steps = server.call(server.steps.get_steps("acme", "live-run"))
                    if predicate(steps):
                        return time.monotonic()
                    time.sleep(0.05)
                raise AssertionError(f"the worker never wrote {what}; log:\n{worker.tail()}")

            produce(event("run_start", 0, agent_name="live-agent"),
                    event("tool_call", 1, call_id="c1", tool="search", arguments={"q": "x"}))  # fmt: skip
            written(lambda s: len(s) == 1, "the first step")
            view: Watched = watched()
            page = view.page
            page.goto(f"{server.base_url}/ui/login")
            page.get_by_label("Token").fill(token)
            page.get_by_role("button", name="Sign in").click()
            page.goto(f"{server.base_url}/ui/companies/acme/runs/live-run")
            expect(page.locator("[data-live-state]")).to_have_text("live")

            # seq 2 (the result of c1) is held back: seq 3 opens a new step past a gap.
            produce(event("llm_request", 3, call_id="l1", provider="openai", model="gpt", input=["hi"]))
            at = written(lambda s: len(s) == 2, "the llm step")
            expect(page.locator("#step-1")).to_contain_text("openai/gpt", timeout=int(WITHIN * 1000))
            assert time.monotonic() - at <= WITHIN + 0.5  # expect's own polling on top

            produce(event("tool_result", 2, call_id="c1", output={"hits": 3}))  # late: fills step 0
            at = written(lambda s: s[0].status == "ok", "the late result")
            expect(page.locator("#step-0 .status")).to_contain_text("ok", timeout=int(WITHIN * 1000))
            assert time.monotonic() - at <= WITHIN + 0.5
            expect(page.locator("ol.steps > li")).to_have_count(2)  # filled in place, not appended

            produce(event("llm_response", 4, call_id="l1", output="done"), event("run_end", 5, status="completed"))
            expect(page.locator("[data-live-state]")).to_have_text("ended", timeout=30_000)
            assert [m for m in view.console if "Content Security Policy" in m or m.startswith("pageerror")] == []
            view.screenshot("live-worker")
        finally:
            scenario.stop_all()
