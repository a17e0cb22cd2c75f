"""Event envelopes on the deep side (issue 13): what is kept, and its bounds."""

from __future__ import annotations

from fold_support import Script, fold_all

from stepstream.core import wire
from stepstream.core.caps import CLIP_MARKER
from stepstream.core.envelope import envelope
from stepstream.core.limits import Limits


def _decoded(events: list) -> list:
    return [wire.decode_event(wire.encode_event(e)) for e in events]


def test_llm_envelopes_keep_provider_model_params_usage_stop_reason() -> None:
    s = Script()
    s("run_start", agent_name="a")
    s("llm_request", call_id="c", provider="anthropic", model="claude", input="hi", params={"temperature": 0})
    s("llm_response", call_id="c", output="yo", usage={"input_tokens": 3, "output_tokens": 4, "reasoning_tokens": 5},
      stop_reason="end_turn")  # fmt: skip
    s("run_end", status="completed")
    store, _ = fold_all(_decoded(s.events))
    [deep] = store.deeps.values()
    call, result = deep.call_event, deep.result_event
    assert call == {"id": "r1-1", "type": "llm_request", "seq": 1, "ts": call["ts"], "call_id": "c",
                    "provider": "anthropic", "model": "claude", "params": {"temperature": 0}}  # fmt: skip
    assert result["usage"] == {"input_tokens": 3, "output_tokens": 4, "reasoning_tokens": 5}
    assert (result["id"], result["stop_reason"], result["type"]) == ("r1-2", "end_turn", "llm_response")
    [run] = store.runs.values()
    assert (run.start_event_id, run.end_event_id) == ("r1-0", "r1-3")


def test_envelopes_are_bounded() -> None:
    s = Script()
    event = s("llm_request", call_id="c", provider="p" * 5000, model="m" * 300, input="x",
              params={"blob": "y" * 100_000})  # fmt: skip
    event.parent_id = "q" * 129
    env = envelope(event, Limits())
    assert len(env["provider"]) == 256 and len(env["model"]) == 256
    assert "parent_id" not in env
    assert isinstance(env["params"], str) and env["params"].endswith(CLIP_MARKER) and env["params_clipped"]
    assert len(env["params"]) == Limits().arguments_chars
    event.parent_id = "p-1"
    assert envelope(event, Limits())["parent_id"] == "p-1"


def test_thinking_keeps_its_first_delta_across_flushes_and_results_keep_calls() -> None:
    s = Script()
    s("run_start", agent_name="a")
    s.think(*(f"chunk {i} " for i in range(40)))
    s("tool_call", call_id="t", tool="search", arguments={"q": 1})
    s("tool_result", call_id="t", output="done", is_error=True)
    store, outs = fold_all(_decoded(s.events), Limits(flush_deltas=4))
    thinking_writes = [d for o in outs for d in o.deeps if d.kind == "thinking"]
    assert len(thinking_writes) > 5  # many chunks, one envelope
    assert sum(d.call_event is not None for d in thinking_writes) == 1
    deeps = sorted(store.deeps.values(), key=lambda d: d.step_seq)
    assert deeps[0].call_event["id"] == "r1-1" and deeps[0].call_event["type"] == "thinking_delta"
    tool = deeps[1]
    assert tool.call_event["tool"] == "search" and tool.call_event["id"] == "r1-41"
    assert tool.result_event == {"id": "r1-42", "type": "tool_result", "seq": 42, "ts": tool.result_event["ts"],
                                 "call_id": "t", "status": "error"}  # fmt: skip
