"""The credential corpus (issue 10) on every operator surface: steps, run records,
dead-letter details and logs mask 100% of it; the deep companions keep 100%; the
innocent look-alikes are masked under 1% (the rate is printed: ``-s`` shows it)."""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter

import msgspec
import pytest
from fold_support import Script, fold_all
from secret_corpus import innocent_cases, secret_cases, strings_of
from stepstream.core.redact import LABEL_CHARS, mask_credentials, redact, scrub
from stepstream.core.wire import decode_event
from stepstream.errors import WireError
from stepstream.logscrub import scrub_record

SECRETS = secret_cases()
INNOCENT = innocent_cases()


def test_the_corpus_is_large_and_covers_every_class():
    assert len(SECRETS) >= 500 and len(INNOCENT) >= 500
    kinds = Counter(c.kind for c in SECRETS)
    contexts = Counter(c.context for c in SECRETS)
    assert len(kinds) >= 45 and all(n >= 5 for n in kinds.values())
    assert set(contexts) == {"bare", "url", "command", "json_in_string", "header_block"}


def _run_of(text: str) -> Script:
    s = Script()
    s("run_start", agent_name=text if len(text) <= 256 else "bot " + text[:200], environment=text)
    s("tool_call", call_id="c1", tool="shell.exec", arguments={"cmd": text, "nested": [{"note": text}], text: 1})
    s("tool_result", call_id="c1", output="done")
    s("llm_request", call_id="l1", provider=text, model="m", input="hi", params={"system": text})
    s("state_change", key=text, value={"v": text})
    s("error", message=text, kind=text)
    s("run_end", status="failed", failure=text)
    return s


def test_every_secret_is_masked_on_steps_and_run_records_and_kept_in_deep():
    leaked: Counter = Counter()
    lost: Counter = Counter()
    for case in SECRETS:
        store, outs = fold_all(_run_of(case.text).events)
        visible = [s for out in outs for s in strings_of([out.steps, out.run])]
        if any(case.secret in s for s in visible):
            leaked[(case.kind, case.context)] += 1
        tool_deep = store.deeps[("acme", "r1", 0)]
        state_deep = store.deeps[("acme", "r1", 2)]
        error_deep = store.deeps[("acme", "r1", 3)]
        kept = (
            tool_deep.arguments["cmd"] == case.text  # deep bodies are JSON values
            and state_deep.arguments == {"v": case.text}
            and error_deep.output == case.text
        )
        if not kept:
            lost[(case.kind, case.context)] += 1
    assert not leaked, f"leaked on steps or run records: {dict(leaked)}"
    assert not lost, f"not kept verbatim in deep: {dict(lost)}"


def test_pointers_and_rules_name_no_secret():
    for case in SECRETS:
        value, pointers, rules = redact({"cmd": case.text, case.text: {"x": case.text}})
        assert pointers and len(pointers) == len(rules)
        assert not any(case.secret in p for p in pointers + rules), case
        assert not any(case.secret in s for s in strings_of(value)), case


def _bad_message(text: str, where: str) -> bytes:
    event = {
        "v": 1, "event_id": "e1", "company_id": "acme", "run_id": "r1", "seq": 0,
        "ts": "2026-11-29T10:00:00Z", "type": "run_end", "payload": {"status": "completed"},
    }  # fmt: skip
    if where == "type":
        event["type"] = text
    elif where == "status":
        event["payload"]["status"] = text
    elif where == "version":
        event["v"] = text
    elif where == "seq":
        event["seq"] = text
    elif where == "ts":
        event["ts"] = text
    elif where == "call_id":
        event["type"] = "tool_call"
        event["payload"] = {"call_id": [text], "tool": "t", "arguments": {}}
    return json.dumps(event).encode()


@pytest.mark.parametrize("where", ["type", "status", "version", "seq", "ts", "call_id"])
def test_decode_errors_name_the_field_never_the_value(where):
    for case in SECRETS:
        with pytest.raises(WireError) as info:
            decode_event(_bad_message(case.text, where))
        detail = info.value.detail
        assert case.secret not in detail and case.secret not in str(info.value), (where, case.kind)
        assert "at `$." in detail  # the field is named
        # What the worker puts in the stepstream-detail header and its warning log:
        assert case.secret not in scrub(detail, 500)


def test_a_failure_of_any_shape_keeps_no_secret_on_the_run_record():
    from stepstream.core.failures import coerce_failure

    for case in SECRETS:
        for failure in ([case.text], {"kind": case.text, "detail": case.text}, {"message": {"why": case.text}}):
            record, _ = coerce_failure("failed", failure)
            assert record is not None and case.secret not in msgspec.json.encode(record).decode(), case.kind


def test_a_detail_or_log_line_that_quotes_a_secret_is_masked():
    for case in SECRETS:
        detail = f"Invalid value {case.text!r} - at `$.payload.status`"
        assert case.secret not in scrub(detail, 100_000), case.kind
    logger = logging.getLogger("stepstream.test")
    for case in SECRETS:
        try:
            raise ValueError(f"boom with {case.text}")
        except ValueError:
            record = logger.makeRecord(
                "stepstream.test", logging.WARNING, __file__, 1, "dead letter %s: %s", ("x", case.text), sys.exc_info()
            )
        scrub_record(record)
        line = logging.Formatter("%(levelname)s %(message)s").format(record)
        assert case.secret not in line, case.kind
        assert "ValueError" in line  # the traceback is kept, scrubbed


def test_innocent_look_alikes_are_kept():
    masked = [text for text in INNOCENT if mask_credentials(text) != text]
    rate = len(masked) / len(INNOCENT)
    print(f"\ninnocent look-alikes masked: {len(masked)} of {len(INNOCENT)} ({100 * rate:.2f}%)")
    assert rate < 0.01, masked[:10]


def test_innocent_strings_pass_scrub_unchanged_when_short():
    for text in INNOCENT:
        if len(text) <= LABEL_CHARS and mask_credentials(text) == text:
            assert scrub(text) == text


def test_a_scrubbed_record_survives_faust_formatter():
    # mode's ExtensionFormatter turns args that are not a tuple into one and formats
    # again: a scrubbed record must keep an empty tuple, and a "%" in its text.
    from mode.utils.logging import ExtensionFormatter

    record = logging.getLogger("x").makeRecord("x", logging.WARNING, __file__, 1, "100%% of %s", ("token=abc123",), None)
    scrub_record(record)
    line = ExtensionFormatter(fmt="%(message)s").format(record)
    assert line.startswith("100% of token=[redacted]")
