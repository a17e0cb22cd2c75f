"""The SDK's envelope and call rules, read from its ``tee`` (no broker needed: the
sender thread retries a closed port in the background and close() counts the rest)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import datetime, timezone

import msgspec
import pytest

from stepstream.core.wire import decode_event
from stepstream.emitter import Tracer
from stepstream.emitter import failure_of


@pytest.fixture
def captured() -> Iterator[tuple[Tracer, list[dict]]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen: list[dict] = []
    clock = lambda: datetime(2026, 11, 30, 12, 0, 0, 250000, tzinfo=timezone.utc)  # noqa: E731
    tracer = Tracer(f"kafka://127.0.0.1:{port}", max_queue=10_000, clock=clock, tee=lambda b: seen.append(msgspec.json.decode(b)))
    yield tracer, seen
    tracer.close(timeout=0)


def test_every_event_type_has_a_call_and_a_valid_envelope(captured: tuple[Tracer, list[dict]]) -> None:
    tracer, seen = captured
    with tracer.run("acme", "r-1", agent_name="bot", metadata={"ticket": "T-1"}) as run:
        parent = run.llm_request("c1", provider="openai", model="gpt-4.1", input=[{"role": "user", "content": "hi"}], params={"t": 0})
        run.thinking("hmm", parent_id=parent)
        run.llm_response("c1", {"content": "ok"}, usage={"input_tokens": 3}, stop_reason="end_turn")
        run.tool_call("t1", "fs.read", {"path": "/x"})
        run.tool_result("t1", "boom", is_error=True)
        run.state_change("k", [1, 2])
        run.error("oops", kind="timeout")
    types = [e["type"] for e in seen]
    assert types == ["run_start", "llm_request", "thinking_delta", "llm_response", "tool_call", "tool_result",
                     "state_change", "error", "run_end"]  # fmt: skip
    assert [e["seq"] for e in seen] == list(range(9))
    assert len({e["event_id"] for e in seen}) == 9
    assert {e["ts"] for e in seen} == {"2026-11-30T12:00:00.250000Z"}
    assert seen[2]["parent_id"] == seen[1]["event_id"] and "parent_id" not in seen[3]
    for event in seen:
        decoded = decode_event(msgspec.json.encode(event))  # valid wire v1
        assert (decoded.company_id, decoded.run_id) == ("acme", "r-1")


def test_ids_are_checked_and_generated(captured: tuple[Tracer, list[dict]]) -> None:
    tracer, _ = captured
    with pytest.raises(ValueError, match="company_id"):
        tracer.run("acme corp", agent_name="bot")
    with pytest.raises(ValueError, match="run_id"):
        tracer.run("acme", "a/b", agent_name="bot")
    assert tracer.run("acme", agent_name="bot").run_id != tracer.run("acme", agent_name="bot").run_id


def test_misuse_raises_at_the_call_and_uses_no_seq(captured: tuple[Tracer, list[dict]]) -> None:
    tracer, seen = captured
    run = tracer.run("acme", "r-2", agent_name="bot")
    with pytest.raises(RuntimeError, match="not started"):
        run.thinking("early")
    run.start()
    with pytest.raises(TypeError):
        run.state_change("k", object())  # not JSON
    with pytest.raises(ValueError, match="needs a failure"):
        run.end("failed")
    run.thinking("fine")
    run.end("failed", {"type": "ToolError", "message": "boom", "step": 3})
    with pytest.raises(RuntimeError, match="has ended"):
        run.thinking("late")
    assert [e["seq"] for e in seen] == [0, 1, 2]
    assert seen[-1]["payload"]["failure"] == {"type": "ToolError", "message": "boom", "step": 3}


def test_seq_stays_strictly_increasing_across_threads(captured: tuple[Tracer, list[dict]]) -> None:
    tracer, seen = captured
    run = tracer.run("acme", "r-3", agent_name="bot")
    run.start()
    threads = [threading.Thread(target=lambda n=n: [run.thinking(f"{n}.{i}") for i in range(200)]) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e["seq"] for e in seen] == list(range(1 + 8 * 200))  # queue order is seq order


def test_failure_object_of_an_exception() -> None:
    assert failure_of(ValueError("bad")) == {"type": "ValueError", "message": "bad"}
    assert failure_of(RuntimeError()) == {"type": "RuntimeError", "message": "RuntimeError"}
    assert len(failure_of(ValueError("x" * 10_000))["message"]) == 4000
