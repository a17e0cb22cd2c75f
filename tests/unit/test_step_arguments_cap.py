"""The operator view is capped like the deep side: a step's redacted ``arguments``
are clipped at the argument cap with the clip marker (``core.steps.step_arguments``),
never refused, and an argument within the cap is the redacted value itself."""

from __future__ import annotations

import msgspec
from fold_support import Script, fold_all
from stepstream.core.caps import CLIP_MARKER
from stepstream.core.fold import Limits

CAP = Limits().arguments_chars


def _only_step(script: Script):
    store, _ = fold_all(script.events)
    (step,) = store.steps.values()
    (deep,) = store.deeps.values()
    return step, deep


def test_a_million_character_tool_argument_is_clipped_on_the_step_with_its_marker():
    s = Script()
    s("tool_call", call_id="t1", tool="write", arguments={"text": "x" * 1_000_000})
    step, deep = _only_step(s)
    assert isinstance(step.arguments, str) and len(step.arguments) == CAP
    assert step.arguments.startswith('{"text":"xxx') and step.arguments.endswith(CLIP_MARKER)
    assert deep.clipped and len(deep.arguments) == CAP  # the deep body, the same ceiling


def test_llm_params_and_state_values_are_clipped_the_same_way():
    s = Script()
    s("llm_request", call_id="l1", provider="p", model="m", input="hi", params={"stop": ["y" * 100_000]})
    s("llm_response", call_id="l1", output="ok")
    s("state_change", key="notes", value="z" * 100_000)
    store, _ = fold_all(s.events)
    llm, state = (store.steps[k] for k in sorted(store.steps))
    for step in (llm, state):
        assert isinstance(step.arguments, str) and len(step.arguments) == CAP
        assert step.arguments.endswith(CLIP_MARKER)


def test_redaction_happens_before_the_cap_and_small_arguments_stay_values():
    s = Script()
    s("tool_call", call_id="t1", tool="login", arguments={"password": "p" * 100_000, "user": "ann"})
    step, _ = _only_step(s)
    assert step.arguments == {"password": "[redacted]", "user": "ann"}  # redacted: short, kept whole


def test_a_smaller_cap_is_the_ceiling_and_the_clip_is_by_characters():
    s = Script()
    s("tool_call", call_id="t1", tool="t", arguments={"q": "日" * 500})
    store, _ = fold_all(s.events, Limits(arguments_chars=100))
    (step,) = store.steps.values()
    assert len(step.arguments) == 100 and step.arguments.endswith(CLIP_MARKER)
    msgspec.json.encode(step.arguments).decode("utf-8")  # valid UTF-8, no split character
