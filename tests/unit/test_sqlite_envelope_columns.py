"""A SQLite file made before the deep envelopes existed (issue 13) gets their columns
when it is opened; old rows read with no envelope, new writes keep theirs. Also the
run record's event-id columns."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stepstream.core.records import DeepRecord, RunRecord, RunState
from stepstream.sinks.sqlite import SqliteDeepStore, SqliteStepStore
from stepstream.sinks.sqlite_operations import deep_schema, step_schema

OLD_DEEP = deep_schema().replace("  call_event TEXT,\n  result_event TEXT,\n", "")
OLD_STEPS = step_schema().replace("  start_event_id TEXT,\n  end_event_id TEXT,\n", "")


async def test_old_file_gets_the_envelope_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    assert "call_event" not in OLD_DEEP and "start_event_id" not in OLD_STEPS
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_DEEP + OLD_STEPS)
        conn.execute("INSERT INTO run_step_details (company_id, run_id, step_seq, kind, ts, output, clipped) "
                     "VALUES ('c', 'r', 0, 'tool', '2026-01-01T00:00:00.000000Z', '\"old\"', 0)")  # fmt: skip
        conn.execute("INSERT INTO deep_runs VALUES ('c', 'r', '2026', '2026', '2026', 1, NULL)")
    deep = await SqliteDeepStore(str(path)).open()
    try:
        [old] = await deep.get_deep("c", "r")
        assert (old.output, old.call_event, old.result_event) == ("old", None, None)
        env = {"id": "e1", "type": "tool_call", "seq": 1, "ts": "2026-01-01T00:00:01.000000Z", "tool": "t"}
        await deep.write([DeepRecord(company_id="c", run_id="r", step_seq=1, kind="tool",
                                     ts="2026-01-01T00:00:01.000000Z", arguments={"a": 1}, call_event=env)])  # fmt: skip
        rows = await deep.get_deep("c", "r")
        assert rows[1].call_event == env
    finally:
        await deep.close()
    steps = await SqliteStepStore(str(path)).open()
    try:
        run = RunRecord(company_id="c", run_id="r", start_event_id="s-0", end_event_id="s-9",
                        started_at="2026-01-01T00:00:00.000000Z", last_event_at="2026-01-01T00:00:00.000000Z")  # fmt: skip
        await steps.write([], [run], [RunState(company_id="c", run_id="r", last_seq=0, run=run)])
        stored = await steps.get_run("c", "r")
        assert (stored.start_event_id, stored.end_event_id) == ("s-0", "s-9")
    finally:
        await steps.close()
