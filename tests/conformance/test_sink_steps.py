"""The step store port: steps, run records, run states."""

from __future__ import annotations

import pytest

from stepstream.core.records import Failure
from stepstream.sinks import InvalidCursor, RunFilter, StepStore

from sink_support import COMPANY, OTHER, UNICODE, run, state, step, ts


async def test_unknown_run_reads_empty(step_store: StepStore) -> None:
    assert await step_store.get_steps(COMPANY, "nope") == []
    assert await step_store.get_run(COMPANY, "nope") is None
    assert await step_store.load_states(COMPANY, ["nope"]) == {}
    assert await step_store.load_states(COMPANY, []) == {}
    assert await step_store.list_runs(COMPANY) == []
    page = await step_store.list_runs_page(COMPANY)
    assert page.runs == [] and page.next_cursor is None


async def test_out_of_order_writes_read_back_in_ordinal_order(step_store: StepStore) -> None:
    await step_store.write([step(5), step(1)])
    await step_store.write([step(3)])
    await step_store.write([step(0), step(2, kind="thinking"), step(4)])
    got = await step_store.get_steps(COMPANY, "r1")
    assert [s.step_seq for s in got] == [0, 1, 2, 3, 4, 5]
    assert got[2].kind == "thinking"


async def test_a_rewrite_replaces_and_never_stacks(step_store: StepStore) -> None:
    await step_store.write([step(0, label="ls", status="running", started_at=ts(1))])
    await step_store.write([step(0, label="ls -la", status="ok", ended_at=ts(2))])
    await step_store.write([step(0, label="ls -la", status="ok", ended_at=ts(2))])  # replayed
    assert await step_store.get_steps(COMPANY, "r1") == [
        step(0, label="ls -la", status="ok", started_at=ts(1), ended_at=ts(2)),
    ]


@pytest.mark.parametrize("one_batch", [False, True], ids=["two-writes", "one-batch"])
async def test_field_by_field_merge_completes_a_call_row(step_store: StepStore, one_batch: bool) -> None:
    call = step(
        0,
        label="read_file",
        status="running",
        call_id="c1",
        arguments={"path": "/etc/hosts", "api_key": "[redacted]"},
        input_shape="2 fields",
        started_at=ts(1),
    )
    result = step(0, status="ok", output_shape="4.2k characters", ended_at=ts(2))
    if one_batch:
        await step_store.write([call, result])
    else:
        await step_store.write([call])
        await step_store.write([result])
    assert await step_store.get_steps(COMPANY, "r1") == [
        step(
            0,
            label="read_file",
            status="ok",
            call_id="c1",
            arguments={"path": "/etc/hosts", "api_key": "[redacted]"},
            input_shape="2 fields",
            output_shape="4.2k characters",
            started_at=ts(1),
            ended_at=ts(2),
        )
    ]


async def test_records_round_trip_exactly(step_store: StepStore) -> None:
    arguments = {
        "text": UNICODE,
        "nested": {"list": [1, -2, 3.5, 0.1, True, False, None, "x"], "empty": {}, "big": 2**62},
        "$ref": "#/a",
        "a.b": {"tool:call.1": "dots and dollars in keys"},
        UNICODE: "unicode key",
    }
    full_step = step(
        7,
        kind="llm",
        label=UNICODE,
        status="error",
        call_id="call.1:\U0001f600",
        arguments=arguments,
        input_shape="12 items",
        output_shape="140 characters",
        started_at=ts(3),
        ended_at=ts(4),
    )
    full_run = run(
        agent_name=UNICODE,
        environment={"region": "eu", "$ref": {"a.b": [1, 2**62, None]}, "text": UNICODE},
        status="failed",
        failure=Failure(type="ToolError", message="boom " + UNICODE, step=3),
        started_at=ts(1),
        ended_at=ts(9),
        last_event_at=ts(9),
        step_count=500,
        input_tokens=123_456_789,
        output_tokens=42,
        reasoning_tokens=7,
        truncated=True,
        dropped_steps=3,
        seq_gaps=2,
        late_events=1,
    )
    full_state = state(
        last_seq=41,
        next_ordinal=8,
        thinking_ordinal=7,
        thinking_chars=65_536,
        thinking_clipped=True,
        thinking_started_at=ts(2),
        open_calls={"tool:c.1": 3, "llm:$x": 5},
        run=full_run,
        skipped_seqs=((2, 2), (30, 39)),
        awaiting_calls={"tool:late": 6},
    )
    await step_store.write([full_step, step(0, kind="state")], [full_run], [full_state])
    assert (await step_store.get_steps(COMPANY, "r1"))[1] == full_step
    assert await step_store.get_run(COMPANY, "r1") == full_run
    assert await step_store.load_states(COMPANY, ["r1", "other"]) == {"r1": full_state}
    assert await step_store.list_runs(COMPANY) == [full_run]
    # A record with every optional field left out reads back the same, too.
    assert (await step_store.get_steps(COMPANY, "r1"))[0] == step(0, kind="state")


async def test_run_record_and_state_replace_whole(step_store: StepStore) -> None:
    """Whole, except the environment (and the compactor's mark): the engine writes it
    once, with its run_start, so a later record written without one keeps it."""
    await step_store.write(
        [], [run(agent_name="a", environment="prod", status="failed", step_count=3)], [state(open_calls={"tool:x": 1})]
    )
    await step_store.write([], [run(agent_name="a", step_count=4)], [state(last_seq=9)])
    assert await step_store.get_run(COMPANY, "r1") == run(agent_name="a", environment="prod", step_count=4)
    assert await step_store.load_states(COMPANY, ["r1"]) == {"r1": state(last_seq=9)}
    # A later run_start's environment replaces it; within one batch too, in order.
    await step_store.write([], [run(environment={"os": "linux"}), run(step_count=5)], [state(last_seq=10)])
    assert await step_store.get_run(COMPANY, "r1") == run(environment={"os": "linux"}, step_count=5)


async def test_load_states_reads_many_runs(step_store: StepStore) -> None:
    states = [state(f"r{i}", last_seq=i, next_ordinal=i + 1, open_calls={f"llm:{i}": i}) for i in range(30)]
    await step_store.write([], [], states)
    wanted = [f"r{i}" for i in range(0, 30, 3)] + ["missing"]
    assert await step_store.load_states(COMPANY, wanted) == {s.run_id: s for s in states[::3]}


async def test_writing_a_batch_twice_changes_nothing(step_store: StepStore) -> None:
    batch = (
        [step(0, label="a"), step(0, status="ok"), step(1, kind="thinking")],
        [run(step_count=2)],
        [state(last_seq=5)],
    )
    assert await step_store.write(*batch) == []
    first = (
        await step_store.get_steps(COMPANY, "r1"),
        await step_store.get_run(COMPANY, "r1"),
        await step_store.load_states(COMPANY, ["r1"]),
    )
    # Replayed after it landed: the run already holds this last_seq, so it is skipped.
    assert await step_store.write(*batch) == [(COMPANY, "r1")]
    assert (
        await step_store.get_steps(COMPANY, "r1"),
        await step_store.get_run(COMPANY, "r1"),
        await step_store.load_states(COMPANY, ["r1"]),
    ) == first


async def test_list_runs_most_recent_first_with_a_cursor(step_store: StepStore) -> None:
    runs = [
        run("a", started_at=ts(5)),
        run("b", started_at=ts(5)),  # tie on time: larger run_id first
        run("c", started_at=ts(9)),
        run("d", last_event_at=ts(7)),  # not started: ranked by its last event
        run("e", started_at=ts(1), last_event_at=ts(99)),  # started_at wins
        run("f"),  # neither: last
        run("g", started_at=ts(8)),
    ]
    await step_store.write([], runs)
    expected = ["c", "g", "d", "b", "a", "e", "f"]
    assert [r.run_id for r in await step_store.list_runs(COMPANY)] == expected
    assert [r.run_id for r in await step_store.list_runs(COMPANY, limit=2)] == expected[:2]

    seen, cursor, pages = [], None, 0
    while True:
        page = await step_store.list_runs_page(COMPANY, limit=3, before=cursor)
        seen += [r.run_id for r in page.runs]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == expected and pages == 3

    # A cursor is a position, not a snapshot: a run written later lands where it sorts.
    first = await step_store.list_runs_page(COMPANY, limit=2)
    await step_store.write([], [run("h", started_at=ts(0))])
    rest = await step_store.list_runs(COMPANY, limit=50, before=first.next_cursor)
    assert [r.run_id for r in rest] == ["d", "b", "a", "e", "h", "f"]


async def test_list_runs_page_exactly_full_has_no_next_cursor(step_store: StepStore) -> None:
    await step_store.write([], [run(f"r{i}", started_at=ts(i)) for i in range(4)])
    page = await step_store.list_runs_page(COMPANY, limit=4)
    assert len(page.runs) == 4 and page.next_cursor is None


async def test_list_runs_filters_in_the_query_with_full_pages(step_store: StepStore) -> None:
    runs = [
        run("ok1", status="completed", agent_name="a", started_at=ts(1)),
        run("gap", status="completed", agent_name="a", started_at=ts(2), seq_gaps=3),
        run("late", status="running", agent_name="b", started_at=ts(3), late_events=1),
        run("drop", status="completed", agent_name="b", started_at=ts(4), dropped_steps=2),
        run("cut", status="completed", agent_name="a", started_at=ts(5), truncated=True),
        run("fail", status="failed", agent_name="a", started_at=ts(6)),
        run("gone", status="abandoned", agent_name="b", last_event_at=ts(7)),
        run("ok2", status="running", agent_name="a", started_at=ts(8)),
        run("ok3", status="completed", agent_name="a", started_at=ts(9)),
        run("elsewhere", company=OTHER, status="failed", agent_name="a", started_at=ts(10)),
    ]
    await step_store.write([], runs)

    async def ids(where: RunFilter, limit: int = 50) -> list[str]:
        seen, cursor = [], None
        while True:
            page = await step_store.list_runs_page(COMPANY, limit=limit, before=cursor, where=where)
            seen += [r.run_id for r in page.runs]
            if page.next_cursor is None:
                return seen
            cursor = page.next_cursor

    assert await ids(RunFilter(problems=True)) == ["gone", "fail", "cut", "drop", "late", "gap"]
    assert await ids(RunFilter(problems=True), limit=2) == ["gone", "fail", "cut", "drop", "late", "gap"]
    assert await ids(RunFilter(status="completed")) == ["ok3", "cut", "drop", "gap", "ok1"]
    assert await ids(RunFilter(agent="b")) == ["gone", "drop", "late"]
    assert await ids(RunFilter(since=ts(3), until=ts(7))) == ["fail", "cut", "drop", "late"]  # until excluded
    assert await ids(RunFilter(since=ts(7))) == ["ok3", "ok2", "gone"]  # by last_event_at when not started
    assert await ids(RunFilter(status="completed", agent="a", problems=True)) == ["cut", "gap"]
    assert await ids(RunFilter(status="running", agent="zzz")) == []
    # A page of a filtered list is full when enough runs match: the filter is in the query.
    page = await step_store.list_runs_page(COMPANY, limit=3, where=RunFilter(agent="a"))
    assert [r.run_id for r in page.runs] == ["ok3", "ok2", "fail"] and page.next_cursor is not None


async def test_a_bad_cursor_or_limit_is_refused(step_store: StepStore) -> None:
    with pytest.raises(InvalidCursor):
        await step_store.list_runs(COMPANY, before="not a cursor!")
    with pytest.raises(InvalidCursor):
        await step_store.list_runs(COMPANY, before="eyJhIjoxfQ")  # base64 of {"a":1}
    with pytest.raises(ValueError):
        await step_store.list_runs(COMPANY, limit=0)


async def test_an_empty_write_is_a_no_op(step_store: StepStore) -> None:
    await step_store.write([], [], [])
    assert await step_store.list_runs(COMPANY) == []


async def test_a_late_batch_never_moves_a_run_backwards(step_store: StepStore) -> None:
    """A former partition owner, paused past its session timeout, writes a batch
    after the new owner wrote further: every row of that run in it is skipped."""
    newer = (
        [step(0, label="ls", status="ok", ended_at=ts(3)), step(1, label="cat", status="running")],
        [run(step_count=2, last_event_at=ts(3))],
        [state(last_seq=10, next_ordinal=2)],
    )
    assert await step_store.write(*newer) == []
    late = (
        [
            step(0, label="ls", status="running"),  # older than what is stored
            step(2, label="never happened"),  # a row the new owner has not written
            step(0, "r2", label="first of r2"),  # a run with no stored state: written
            step(0, "r3", label="no state in the batch"),  # no state at all: written
        ],
        [run(step_count=1, last_event_at=ts(1)), run("r2", step_count=1), run("r3", step_count=1)],
        [state(last_seq=7, next_ordinal=1), state("r2", last_seq=0, next_ordinal=1)],
    )
    assert await step_store.write(*late) == [(COMPANY, "r1")]
    assert await step_store.get_steps(COMPANY, "r1") == newer[0]
    assert await step_store.get_run(COMPANY, "r1") == newer[1][0]
    assert await step_store.load_states(COMPANY, ["r1", "r2"]) == {"r1": newer[2][0], "r2": late[2][1]}
    assert await step_store.get_steps(COMPANY, "r2") == [step(0, "r2", label="first of r2")]
    assert await step_store.get_steps(COMPANY, "r3") == [step(0, "r3", label="no state in the batch")]
    assert await step_store.get_run(COMPANY, "r3") == run("r3", step_count=1)
    # The same last_seq again is not ahead either; a later one is written.
    assert await step_store.write([step(2, label="x")], [], [state(last_seq=10)]) == [(COMPANY, "r1")]
    assert await step_store.write([step(2, label="next")], [run(step_count=3)], [state(last_seq=11)]) == []
    assert (await step_store.get_steps(COMPANY, "r1"))[2] == step(2, label="next")
    assert (await step_store.load_states(COMPANY, ["r1"]))["r1"].last_seq == 11


async def test_a_run_is_judged_by_its_last_state_in_the_batch(step_store: StepStore) -> None:
    await step_store.write([], [], [state(last_seq=5)])
    # Two states of r1 in one batch: the last one (6) decides, and it is ahead.
    assert await step_store.write([step(0)], [], [state(last_seq=3), state(last_seq=6)]) == []
    assert (await step_store.load_states(COMPANY, ["r1"]))["r1"].last_seq == 6
    assert await step_store.write([step(1)], [], [state(last_seq=9), state(last_seq=4)]) == [(COMPANY, "r1")]
    assert [s.step_seq for s in await step_store.get_steps(COMPANY, "r1")] == [0]


async def test_the_stale_check_is_per_company(step_store: StepStore) -> None:
    await step_store.write([step(0, label="acme")], [], [state(last_seq=10)])
    # Another company's run of the same id is its own run: nothing stored for it yet.
    assert await step_store.write([step(0, company=OTHER, label="globex")], [], [state(company=OTHER, last_seq=1)]) == []
    assert await step_store.write([step(0, label="late")], [], [state(last_seq=2)]) == [(COMPANY, "r1")]
    assert [s.label for s in await step_store.get_steps(OTHER, "r1")] == ["globex"]
    assert [s.label for s in await step_store.get_steps(COMPANY, "r1")] == ["acme"]


async def test_many_runs_in_one_batch_are_judged_one_by_one(step_store: StepStore) -> None:
    # More runs than one lookup statement takes (SQLite reads stored states in chunks).
    count = 600
    await step_store.write([], [], [state(f"r{i}", last_seq=10) for i in range(0, count, 2)])
    skipped = await step_store.write(
        [step(0, f"r{i}") for i in range(count)], [], [state(f"r{i}", last_seq=5) for i in range(count)]
    )
    assert skipped == [(COMPANY, f"r{i}") for i in range(0, count, 2)]
    stored = await step_store.load_states(COMPANY, [f"r{i}" for i in range(count)])
    assert {r: s.last_seq for r, s in stored.items()} == {f"r{i}": 10 if i % 2 == 0 else 5 for i in range(count)}
    assert await step_store.get_steps(COMPANY, "r1") == [step(0, "r1")]
    assert await step_store.get_steps(COMPANY, "r0") == []
