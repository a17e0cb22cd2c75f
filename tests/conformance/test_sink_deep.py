"""The deep store port: merge, positional reasoning, round trip, clipping at the port."""

from __future__ import annotations

import pytest

from stepstream.core.caps import CLIP_MARKER
from stepstream.core.fold import Limits
from stepstream.sinks import DeepStore

from sink_support import COMPANY, UNICODE, deep

REASONING_CAP, OUTPUT_CAP, ARGUMENTS_CAP = Limits().reasoning_chars, Limits().output_chars, Limits().arguments_chars


async def rows(store: DeepStore, run: str = "r1") -> list:
    return await store.get_deep(COMPANY, run)


async def test_unknown_run_reads_empty(deep_store: DeepStore) -> None:
    assert await deep_store.get_deep(COMPANY, "nope") == []
    assert await deep_store.list_deep_runs(COMPANY) == []
    assert await deep_store.purge_run(COMPANY, "nope") == 0
    assert await deep_store.purge_company(COMPANY) == 0
    assert await deep_store.prune(COMPANY, 0) == []


async def test_out_of_order_writes_read_back_in_ordinal_order(deep_store: DeepStore) -> None:
    await deep_store.write([deep(9), deep(2)])
    await deep_store.write([deep(0), deep(5)])
    assert [d.step_seq for d in await rows(deep_store)] == [0, 2, 5, 9]


async def test_a_rewrite_replaces(deep_store: DeepStore) -> None:
    await deep_store.write([deep(0, arguments='{"a":1}', output='"first"', at=1)])
    await deep_store.write([deep(0, kind="llm", arguments='{"a":2}', output='"second"', at=2)])
    assert await rows(deep_store) == [deep(0, kind="llm", arguments='{"a":2}', output='"second"', at=2)]


@pytest.mark.parametrize("one_batch", [False, True], ids=["two-writes", "one-batch"])
async def test_field_by_field_merge_completes_a_call_row(deep_store: DeepStore, one_batch: bool) -> None:
    call = deep(3, arguments='{"cmd":"cat ~/.aws/credentials"}', at=1)
    result = deep(3, output='"[default]\\naws_secret_access_key=..."', at=2)
    if one_batch:
        await deep_store.write([call, result])
    else:
        await deep_store.write([call])
        await deep_store.write([result])
    assert await rows(deep_store) == [deep(3, arguments=call.arguments, output=result.output, at=2)]


async def test_ts_keeps_the_latest(deep_store: DeepStore) -> None:
    await deep_store.write([deep(0, output='"a"', at=5)])
    await deep_store.write([deep(0, output='"b"', at=3)])  # a late write with an older time
    assert (await rows(deep_store))[0] == deep(0, output='"b"', at=5)
    await deep_store.write([deep(1, at=2), deep(1, at=7), deep(1, at=4)])
    assert (await rows(deep_store))[1].ts == deep(1, at=7).ts


async def test_clipped_is_sticky(deep_store: DeepStore) -> None:
    await deep_store.write([deep(0, output='"x"', clipped=True)])
    await deep_store.write([deep(0, output='"y"', clipped=False)])
    assert (await rows(deep_store))[0].clipped is True
    await deep_store.write([deep(1, output='"z"')])
    assert (await rows(deep_store))[1].clipped is False


async def test_positional_reasoning_merge(deep_store: DeepStore) -> None:
    def chunk(text: str, offset: int, at: int = 0) -> object:
        return deep(0, kind="thinking", reasoning=text, reasoning_offset=offset, at=at)

    await deep_store.write([chunk("abc", 0)])
    await deep_store.write([chunk("def", 3)])
    await deep_store.write([chunk("def", 3)])  # the same chunk again (a replay): no stacking
    assert (await rows(deep_store))[0].reasoning == "abcdef"
    await deep_store.write([chunk("ghi", 6), chunk("ghi", 6), chunk("jk", 9)])  # repeated inside one batch
    assert (await rows(deep_store))[0].reasoning == "abcdefghijk"
    await deep_store.write([chunk("XY", 4)])  # a chunk overwrites its own span, keeps the rest
    assert (await rows(deep_store))[0].reasoning == "abcdXYghijk"
    await deep_store.write([deep(0, kind="thinking", output='"no reasoning in this write"')])  # None keeps
    got = (await rows(deep_store))[0]
    assert (got.reasoning, got.reasoning_offset) == ("abcdXYghijk", 0)
    await deep_store.write([chunk("new", 0)])  # from the start: its span only
    assert (await rows(deep_store))[0].reasoning == "newdXYghijk"
    await deep_store.write([chunk("lm", 20)])  # past the end: appends
    assert (await rows(deep_store))[0].reasoning == "newdXYghijklm"


async def test_a_stale_chunk_never_shortens_the_text(deep_store: DeepStore) -> None:
    """A former owner writing late sends chunks the new owner already wrote, with
    the same text (the fold is deterministic): the row must stay whole."""

    def chunk(text: str, offset: int) -> object:
        return deep(0, kind="thinking", reasoning=text, reasoning_offset=offset)

    text = "0123456789" + UNICODE + "abcdefghij"
    await deep_store.write([chunk(text[:10], 0), chunk(text[10:], 10)])
    for stale in ([chunk(text[:10], 0)], [chunk(text[10:14], 10)], [chunk(text[:4], 0), chunk(text[4:9], 4)]):
        await deep_store.write(stale)
        assert (await rows(deep_store))[0].reasoning == text
    # A chunk inside the text that differs overwrites exactly its span.
    await deep_store.write([chunk("XY", 3)])
    assert (await rows(deep_store))[0].reasoning == text[:3] + "XY" + text[5:]
    # Replays stay idempotent, also across the end of the text.
    end = len(text)
    for _ in range(2):
        await deep_store.write([chunk("tail!", end - 2)])
    assert (await rows(deep_store))[0].reasoning == text[:3] + "XY" + text[5 : end - 2] + "tail!"


async def test_positional_reasoning_counts_characters_not_bytes(deep_store: DeepStore) -> None:
    head = "é\U0001f600\x00\U0010ffff日"  # 2-, 4-, 1-, 4- and 3-byte characters
    await deep_store.write([deep(0, kind="thinking", reasoning=head + "tail")])
    await deep_store.write([deep(0, kind="thinking", reasoning="\U0001f9e0!", reasoning_offset=len(head))])
    assert (await rows(deep_store))[0].reasoning == head + "\U0001f9e0!" + "il"  # its span only


async def test_a_first_write_at_an_offset_stores_its_chunk(deep_store: DeepStore) -> None:
    # After a purge a replay may resume mid-text: the chunk is kept (nothing before it).
    await deep_store.write([deep(0, kind="thinking", reasoning="tail", reasoning_offset=100)])
    got = (await rows(deep_store))[0]
    assert (got.reasoning, got.reasoning_offset) == ("tail", 0)


async def test_records_round_trip_exactly(deep_store: DeepStore) -> None:
    big_reasoning = (UNICODE * (REASONING_CAP // len(UNICODE) + 1))[:REASONING_CAP]
    big_output = ("\U0001f600" + "x" * 99) * (OUTPUT_CAP // 100) + "y" * (OUTPUT_CAP % 100)
    big_arguments = ('{"k":"' + "ü" * ARGUMENTS_CAP)[:ARGUMENTS_CAP]
    records = [
        deep(0, kind="thinking", reasoning=big_reasoning, at=1),
        deep(1, arguments=big_arguments, output=big_output, clipped=True, at=2),
        deep(2, kind="llm", arguments='{"q":' + repr(UNICODE) + "}", output=UNICODE, at=3),
        deep(3, kind="error", at=4),
        deep(4, kind="state", reasoning="", arguments="", output="", at=5),
    ]
    assert len(big_output) == OUTPUT_CAP and len(big_arguments) == ARGUMENTS_CAP
    await deep_store.write(records)
    assert await rows(deep_store) == records


async def test_the_port_clips_bodies_to_the_caps(deep_store: DeepStore) -> None:
    huge = "\U0001f600abc" * 40_000  # 160,000 characters, astral ones at every boundary
    await deep_store.write(
        [deep(0, kind="tool", arguments=huge, output=huge), deep(1, kind="thinking", reasoning=huge)]
    )
    tool, thinking = await rows(deep_store)
    assert tool.clipped and thinking.clipped
    assert 0 < len(tool.arguments) <= ARGUMENTS_CAP and 0 < len(tool.output) <= OUTPUT_CAP
    assert 0 < len(thinking.reasoning) <= REASONING_CAP
    for body in (tool.arguments, tool.output, thinking.reasoning):
        body.encode("utf-8")  # never split into invalid UTF-8
        assert body.startswith(huge[:1000])
        assert body.endswith(CLIP_MARKER)  # a visible marker, not a silent cut


async def test_the_port_clips_positional_reasoning_to_the_cap(deep_store: DeepStore) -> None:
    def chunk(text: str, offset: int) -> object:
        return deep(0, kind="thinking", reasoning=text, reasoning_offset=offset)

    base = "a" * (REASONING_CAP - 1000)
    await deep_store.write([chunk(base, 0)])
    await deep_store.write([chunk("b" * 5000, len(base))])  # crosses the cap
    got = (await rows(deep_store))[0]
    assert got.clipped and len(got.reasoning) <= REASONING_CAP and got.reasoning.startswith(base + "b" * 100)
    clipped_once = got.reasoning
    await deep_store.write([chunk("c" * 5000, REASONING_CAP + 10)])  # starts past the cap
    await deep_store.write([chunk("b" * 5000, len(base))])  # the crossing chunk replayed
    got = (await rows(deep_store))[0]
    assert got.clipped and got.reasoning == clipped_once


async def test_writing_a_batch_twice_changes_nothing(deep_store: DeepStore) -> None:
    batch = [
        deep(0, kind="thinking", reasoning="abc", at=1),
        deep(0, kind="thinking", reasoning="def", reasoning_offset=3, at=2),
        deep(1, arguments="{}", at=3),
        deep(1, output="[]", clipped=True, at=4),
    ]
    await deep_store.write(batch)
    first = await rows(deep_store)
    await deep_store.write(batch)
    assert await rows(deep_store) == first
    assert first[0].reasoning == "abcdef"
    await deep_store.write(batch[:1])  # the first chunk alone, late: the text stays whole
    assert await rows(deep_store) == first


async def test_the_port_clips_to_the_limits_it_was_opened_with(store_url: str) -> None:
    from stepstream.sinks import open_deep_store

    store = await open_deep_store(store_url, limits=Limits(output_chars=20, arguments_chars=20, reasoning_chars=20))
    try:
        await store.write([deep(0, output="o" * 50, arguments="a" * 10), deep(1, kind="thinking", reasoning="r" * 15)])
        await store.write([deep(1, kind="thinking", reasoning="s" * 15, reasoning_offset=15)])
        tool, thinking = await store.get_deep(COMPANY, "r1")
        assert (len(tool.output), tool.arguments, tool.clipped) == (20, "a" * 10, True)
        assert len(thinking.reasoning) == 20 and thinking.reasoning.startswith("r" * 10) and thinking.clipped
    finally:
        await store.close()


async def test_bodies_are_json_values_and_read_back_as_such(deep_store: DeepStore) -> None:
    """Unclipped bodies are kept as JSON values (an export hashes them): objects with
    keys no BSON field may carry, numbers past int64, nesting, and strings with
    control characters and NUL, each read back equal."""
    records = [
        deep(0, arguments={"$ref": {"a.b": [1, 2**70, -0.5, None, True]}, "": UNICODE}, output=[[[]], {}], at=1),
        deep(1, arguments="\x00\x01\n" * 100, output=12.25, at=2),
        deep(2, kind="llm", arguments=[{"role": "user", "content": UNICODE}], output="", at=3),
        deep(3, output=False, at=4),
    ]
    await deep_store.write(records)
    assert await rows(deep_store) == records
    await deep_store.write([deep(0, output={"later": 1}, at=5)])  # field by field: arguments stay
    assert (await rows(deep_store))[0] == deep(0, arguments=records[0].arguments, output={"later": 1}, at=5)


async def test_the_port_counts_what_a_reader_sees_and_reports_its_clips(store_url: str) -> None:
    from stepstream.sinks import open_deep_store

    heard: list[str] = []
    store = await open_deep_store(store_url, limits=Limits(output_chars=30, arguments_chars=30), on_clip=heard.append)
    try:
        fits = deep(0, arguments="\x01" * 30, output={"k": "v"})  # 30 characters; 180 once escaped
        over = deep(1, arguments={"k": "\x01" * 5}, output="o" * 31)  # 35 characters of compact JSON
        await store.write([fits, over])
        first, second = await store.get_deep(COMPANY, "r1")
        assert first == fits and not first.clipped
        assert second.clipped and isinstance(second.arguments, str) and len(second.arguments) == 30
        # Cut inside an escape of the JSON text: the body is a string, so still valid.
        assert second.arguments == '{"k":"\\u0001\\u0001\\u' + CLIP_MARKER
        assert second.arguments.endswith(CLIP_MARKER) and second.output == "o" * 20 + CLIP_MARKER
        assert sorted(heard) == ["arguments", "output"]
        await store.write([first])  # within the caps: nothing more to hear
        assert len(heard) == 2
    finally:
        await store.close()


@pytest.mark.parametrize("one_batch", [False, True], ids=["two-writes", "one-batch"])
async def test_event_envelopes_merge_like_bodies(deep_store: DeepStore, one_batch: bool) -> None:
    """The .sftrace envelopes (issue 13): a result's write keeps the call's envelope,
    free-form keys and values round-trip (JSON text in SQLite and MongoDB)."""
    call_env = {"id": "e-1", "type": "llm_request", "seq": 1, "ts": "2026-01-01T00:00:00.000000Z",
                "provider": "openai", "model": UNICODE, "params": {"$weird.key": [1, 2.5, None], "a.b": {"c": True}}}  # fmt: skip
    result_env = {"id": "e-2", "type": "llm_response", "seq": 2, "ts": "2026-01-01T00:00:01.000000Z",
                  "usage": {"input_tokens": 10**12, "output_tokens": 0, "reasoning_tokens": 3}}  # fmt: skip
    call = deep(4, arguments='{"q":1}', at=1)
    call.call_event = call_env
    result = deep(4, output='"ok"', at=2)
    result.result_event = result_env
    if one_batch:
        await deep_store.write([call, result])
    else:
        await deep_store.write([call])
        await deep_store.write([result])
    [row] = await rows(deep_store)
    assert (row.call_event, row.result_event) == (call_env, result_env)
    later = deep(4, at=3)  # a write without envelopes keeps them
    await deep_store.write([later])
    [row] = await rows(deep_store)
    assert (row.call_event, row.result_event) == (call_env, result_env)
