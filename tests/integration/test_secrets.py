"""Secrets on the real broker (issues 9 and 10): a worker fed runs whose every free
field carries a credential from the corpus, and bad events whose rejected value *is*
the credential. No credential may reach a step, a run record, a dead-letter header
or the worker's log; the deep store keeps every one verbatim."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from harness import Scenario, dump, read_topic, wait_caught_up
from stepstream.core.wire import encode_event

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from fold_support import Script  # noqa: E402
from secret_corpus import secret_cases, strings_of  # noqa: E402

pytestmark = pytest.mark.integration

CASES = secret_cases(seed=31, rounds=1)


def _good_events() -> list:
    events = []
    for i, case in enumerate(CASES):
        text = case.text
        s = Script(company="acme", run=f"secret-{i}")
        s("run_start", agent_name=text if len(text) <= 256 else "bot " + text[:200], environment=text)
        s("tool_call", call_id="c1", tool="shell.exec", arguments={"cmd": text, text: 1})
        s("tool_result", call_id="c1", output="ok")
        s("llm_request", call_id="l1", provider=text, model="m", input="hi", params={"system": text})
        s("state_change", key=text, value={"v": text})
        s("error", message=text, kind=text)
        s("run_end", status="failed", failure=text)
        events.extend(s.events)
    return events


def _bad_messages() -> list[tuple[bytes, bytes]]:
    out = []
    for i, case in enumerate(CASES):
        base = {
            "v": 1, "event_id": f"bad-{i}", "company_id": "acme", "run_id": f"bad-{i}", "seq": 0,
            "ts": "2026-11-29T10:00:00Z", "type": "run_end", "payload": {"status": "completed"},
        }  # fmt: skip
        for field in ("status", "type", "v"):
            event = json.loads(json.dumps(base))
            if field == "status":
                event["payload"]["status"] = case.text
            else:
                event[field] = case.text
            out.append((f"acme/bad-{i}".encode(), json.dumps(event).encode()))
    return out


async def test_no_credential_reaches_steps_runs_dead_letters_or_logs(kafka_bootstrap, tmp_path):
    scenario = Scenario(kafka_bootstrap, tmp_path, partitions=2)
    try:
        await scenario.create_topics()
        worker = scenario.start_worker()
        good = _good_events()
        bad = _bad_messages()
        await scenario.produce(good)
        producer = AIOKafkaProducer(bootstrap_servers=scenario.broker)
        await producer.start()
        try:
            for key, value in bad:
                await producer.send(scenario.topic, value, key=key)
            await producer.flush()
        finally:
            await producer.stop()
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [worker], timeout=240)
        assert worker.alive()
        worker.stop()

        dead = await read_topic(scenario.broker, scenario.topic + ".dlq")
        assert len(dead) == len(bad)
        headers = [value.decode("utf-8", "replace") for record in dead for key, value in record.headers]
        details = [dict(record.headers)["stepstream-detail"].decode() for record in dead]
        assert all("at `$." in d for d in details)  # the field is named
        log = worker.log_path.read_text(errors="replace")
        assert "dead letter" in log  # the warnings were logged, scrubbed
        data = await dump(scenario.steps_url, scenario.deep_url, ["acme"])
        assert len(data) == len(CASES)
        visible = [s for run in data.values() for s in strings_of([run["run"], run["steps"]])]
        deep_text = "\n".join(  # bodies are JSON values: their JSON text holds each secret encoded
            msgspec.json.encode(d.get("arguments") or d.get("output") or "").decode()
            for run in data.values()
            for d in run["deep"]
        )
        for case in CASES:
            assert not any(case.secret in h for h in headers), ("dead-letter header", case.kind)
            assert case.secret not in log, ("worker log", case.kind)
            assert not any(case.secret in s for s in visible), ("steps or run record", case.kind)
            assert msgspec.json.encode(case.text).decode() in deep_text, ("deep", case.kind)
    finally:
        scenario.stop_all()
