"""The compactor beside a live worker on the real broker.

* Runs keep arriving for several companies that share run ids while the compactor
  loops and is SIGKILLed mid-pass a few times (a fault plan slows its deletes so the
  kills land between a mark and a delete). Afterwards every company holds at most its
  limit of runs with bodies, every run with bodies has all of them, no step is
  missing, and no other company was touched: compared record for record with
  ``ingest-file`` of the same events.
* An abandoned run gets its ``run_close`` through the topic, then resumes: it keeps
  every event, and a replay of the topic (closes included) gives the same rows.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from harness import Scenario, dump, free_port, golden_dump, read_topic, wait_caught_up, wait_for
from stepstream.core import wire
from stepstream.core.wire import decode_event
from stepstream.sinks import open_deep_store, open_step_store
from stepstream.sinks.faults import read_log, write_plan

pytestmark = pytest.mark.integration

COMPANIES = ("acme", "globex", "initech")
LIMITS = {"acme": 4, "globex": 6, "initech": 4}  # globex by override; initech has fewer runs than its limit


class CompactorProcess:
    def __init__(self, scenario: Scenario, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log_path = scenario.tmp / f"compactor-{self.port}.log"
        full = dict(os.environ)
        full.update(
            STEPSTREAM_BROKER=scenario.broker,
            STEPSTREAM_TOPIC=scenario.topic,
            STEPSTREAM_STEPS_SINK=scenario.steps_url,
            STEPSTREAM_DEEP_SINK=scenario.deep_url,
            STEPSTREAM_COMPACTOR_WEB_PORT=str(self.port),
            STEPSTREAM_LOG_LEVEL="info",
        )
        full.update(env or {})
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepstream.cli", "compactor", *args], env=full, stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()

    def serving(self, timeout: float = 60.0) -> bool:
        """Until /healthz answers (the stores are open, the signal handlers set);
        False if the process exits or the time runs out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2):
                    return True
            except (OSError, urllib.error.URLError):
                time.sleep(0.1)
        return False

    def stop(self) -> int:
        """SIGTERM once it serves (a process still importing has no handler yet)."""
        if self.proc.poll() is None:
            assert self.serving(), f"the compactor never served /healthz:\n{self.tail()}"
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(20)
        self._log.close()
        return rc

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


T0 = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)


def run_events(company: str, run_id: str, start: datetime, *, end: bool = True, first_seq: int = 0) -> list:
    """A small run: start, a thinking burst, a tool call and result, an LLM call, end."""
    seq = first_seq
    out = []

    def add(cls, payload_cls, **payload):  # type: ignore[no-untyped-def]
        nonlocal seq
        out.append(cls(v=1, event_id=f"{company}-{run_id}-{seq}", company_id=company, run_id=run_id, seq=seq,
                       ts=start + timedelta(milliseconds=10 * seq), payload=payload_cls(**payload)))  # fmt: skip
        seq += 1

    if first_seq == 0:
        add(wire.RunStart, wire.RunStartPayload, agent_name="bot")
    for piece in ("plan ", "the ", "work ", f"for {company}"):
        add(wire.ThinkingDelta, wire.ThinkingDeltaPayload, text=piece)
    add(wire.ToolCall, wire.ToolCallPayload, call_id=f"t{seq}", tool="sh", arguments={"cmd": "ls", "api_key": "x"})
    add(wire.ToolResult, wire.ToolResultPayload, call_id=f"t{seq - 1}", output={"files": [run_id, company]})
    add(wire.LlmRequest, wire.LlmRequestPayload, call_id=f"l{seq}", provider="p", model="m", input=[run_id])
    add(wire.LlmResponse, wire.LlmResponsePayload, call_id=f"l{seq - 1}", output=f"done {company}/{run_id}")
    if end:
        add(wire.RunEnd, wire.RunEndPayload, status="completed")
    return out


async def deep_counts(url: str) -> dict[str, dict[str, int]]:
    deep = await open_deep_store(url)
    try:
        return {c: {r.run_id: r.bodies for r in await deep.retention_index(c)} for c in COMPANIES}
    finally:
        await deep.close()


async def unfinished(url: str) -> int:
    """Runs marked pruned that still hold bodies: what a kill between mark and delete leaves."""
    deep = await open_deep_store(url)
    try:
        found = 0
        for company in COMPANIES:
            found += sum(1 for r in await deep.retention_index(company) if r.pruned_at and r.bodies)
        return found
    finally:
        await deep.close()


async def test_retention_beside_a_live_worker_with_kills_mid_pass(kafka_bootstrap: str, tmp_path: Path) -> None:
    await retention_scenario(kafka_bootstrap, tmp_path, waves=6, kill_after=(2, 3, 5))


@pytest.mark.soak
async def test_retention_soak_many_waves_and_kills(kafka_bootstrap: str, tmp_path: Path) -> None:
    waves = int(os.environ.get("SOAK_COMPACTOR_WAVES", "30"))
    await retention_scenario(kafka_bootstrap, tmp_path, waves=waves, kill_after=tuple(range(2, waves, 2)))


async def retention_scenario(kafka_bootstrap: str, tmp_path: Path, *, waves: int, kill_after: tuple[int, ...]) -> None:
    scenario = Scenario(kafka_bootstrap, tmp_path)
    await scenario.create_topics()
    worker = scenario.start_worker()
    overrides = tmp_path / "retention.toml"
    overrides.write_text("[companies.globex]\ndeep_runs = 6\n")
    plan = tmp_path / "compactor-faults.json"
    # Slow marks of run records and deletes, so kills land mid-pass.
    write_plan(plan, {"seed": 3, "rules": [
        {"store": "steps", "op": "mark_deep_pruned", "action": "hang", "seconds": 0.2, "probability": 0.5},
        {"store": "deep", "op": "delete_pruned", "action": "hang", "seconds": 0.4},
    ]})  # fmt: skip
    env = {"STEPSTREAM_FAULT_PLAN": str(plan), "STEPSTREAM_RETENTION_FILE": str(overrides)}
    args = ("--interval", "0.2", "--deep-runs", "4", "--abandon-after-seconds", "0")
    rng = random.Random(11)
    events: list = []
    compactor = CompactorProcess(scenario, *args, env=env)
    kills = midway = 0
    try:
        worker.wait_web()
        # Waves of runs; the companies share run ids, initech stops after three waves.
        for wave in range(waves):
            batch = []
            for company in COMPANIES:
                if company == "initech" and wave >= 3:
                    continue
                for k in range(2):
                    run_id = f"run-{wave}-{k}"
                    batch.extend(run_events(company, run_id, T0 + timedelta(minutes=wave, seconds=k)))
            events.extend(batch)
            await scenario.produce(batch)
            await asyncio.sleep(rng.uniform(0.1, 0.5))
            if wave in kill_after:  # waves that push some company past its limit
                # SIGKILL while a delete hangs: after the marks, before the bodies go.
                pid = compactor.proc.pid
                await wait_for(lambda: any(e["pid"] == pid and e["op"] == "delete_pruned" for e in read_log(plan)),
                               20, "a pass to reach its delete", interval=0.02)  # fmt: skip
                compactor.kill()
                kills += 1
                midway += await unfinished(scenario.deep_url)
                compactor = CompactorProcess(scenario, *args, env=env)
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=120)
        await asyncio.sleep(1.5)  # the idle flush of thinking tails is long done; let a pass or two run
        assert compactor.stop() == 0, compactor.tail()
    finally:
        compactor.kill()
        worker.stop()
    log = read_log(plan)
    assert kills == len(kill_after) and len({e["pid"] for e in log}) >= kills
    assert midway >= kills  # every kill left marked runs holding bodies, finished by a later pass
    # One last pass with no faults: the state converges (and is already close to it).
    final = subprocess.run(
        [sys.executable, "-m", "stepstream.cli", "compactor", "--once", *args],
        env={**os.environ, "STEPSTREAM_STEPS_SINK": scenario.steps_url, "STEPSTREAM_DEEP_SINK": scenario.deep_url,
             "STEPSTREAM_RETENTION_FILE": str(overrides)},
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert final.returncode == 0, final.stderr.decode()[-2000:]
    got = await dump(scenario.steps_url, scenario.deep_url, list(COMPANIES))
    golden = await golden_dump(events, tmp_path / "golden", list(COMPANIES))
    assert got.keys() == golden.keys()
    counts = await deep_counts(scenario.deep_url)
    for company in COMPANIES:
        total = sum(1 for key in golden if key.startswith(f"{company}/"))
        kept = [key for key in golden if key.startswith(f"{company}/") and got[key]["deep"]]
        assert len(kept) == min(LIMITS[company], total), (company, kept)
        assert sum(1 for n in counts[company].values() if n) == len(kept)
    for key, want in golden.items():
        have = got[key]
        assert have["steps"] == want["steps"], key  # no step missing or changed
        if have["deep"]:
            assert have["deep"] == want["deep"], key  # whole, never torn
            assert "deep_pruned_at" not in have["run"], key
        else:
            assert have["run"].pop("deep_pruned_at"), key  # the run record says so
        have["run"].pop("deep_pruned_at", None)
        assert have["run"] == want["run"], key


async def test_an_abandoned_run_resumes_and_the_topic_replays_to_the_same_rows(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    scenario = Scenario(kafka_bootstrap, tmp_path)
    await scenario.create_topics()
    worker = scenario.start_worker()
    args = ("--interval", "0.3", "--deep-runs", "1000", "--abandon-after-seconds", "2")
    compactor = CompactorProcess(scenario, *args)
    head = run_events("acme", "shared", T0, end=False)[:6]  # start, thinking, a tool call (seq 5) left open
    other = run_events("globex", "shared", T0, end=True)
    try:
        worker.wait_web()
        await scenario.produce(head + other)

        async def status() -> str | None:
            steps = await open_step_store(scenario.steps_url)
            try:
                run = await steps.get_run("acme", "shared")
                return None if run is None else run.status
            finally:
                await steps.close()

        await wait_for(lambda: _is(status, "abandoned"), 30, "the compactor's close to be folded")
        steps = await open_step_store(scenario.steps_url)
        try:
            closed = await steps.get_steps("acme", "shared")
        finally:
            await steps.close()
        assert [(s.kind, s.status) for s in closed] == [("thinking", "ok"), ("tool", "abandoned")]
        # The agent comes back: its next seq is the one after its last, as if nothing happened.
        late = wire.ToolResult(v=1, event_id="acme-shared-6", company_id="acme", run_id="shared", seq=6,
                               ts=T0 + timedelta(hours=2), payload=wire.ToolResultPayload(call_id="t5", output="late"))
        tail = [late, *run_events("acme", "shared", T0 + timedelta(hours=2), first_seq=7)]  # fmt: skip
        await scenario.produce(tail)
        await wait_for(lambda: _is(status, "completed"), 30, "the resumed run to complete")
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=60)
        await asyncio.sleep(1.5)
    finally:
        assert compactor.stop() == 0, compactor.tail()
        worker.stop()
    records = await read_topic(scenario.broker, scenario.topic)
    events = [decode_event(r.value) for r in records]
    closes = [e for e in events if isinstance(e, wire.RunClose)]
    assert closes and all((e.company_id, e.run_id, e.seq) == ("acme", "shared", 5) for e in closes)
    got = await dump(scenario.steps_url, scenario.deep_url, ["acme", "globex"])
    run = got["acme/shared"]
    steps = await open_step_store(scenario.steps_url)
    try:
        state = (await steps.load_states("acme", ["shared"]))["shared"]
    finally:
        await steps.close()
    assert state.last_seq - state.closes == tail[-1].seq and state.closes == 1  # every agent event applied
    assert run["run"]["status"] == "completed"
    tool = run["steps"][1]  # ordinal 0 is the thinking run, 1 the tool call the close marked abandoned
    assert (tool["kind"], tool["status"]) == ("tool", "ok")  # the late result completed its own ordinal
    assert [s["status"] for s in run["steps"]].count("abandoned") == 0
    assert got["globex/shared"]["run"]["status"] == "completed"  # the other company's run was never closed
    # A replay of the topic, closes included, gives the same rows.
    replayed = await golden_dump(events, tmp_path / "replay", ["acme", "globex"])
    assert replayed == got


async def _is(probe, wanted: str) -> bool:  # type: ignore[no-untyped-def]
    return await probe() == wanted
