"""What only one backend has to get right: URL selection, the file format's
crash tolerance, a shared SQLite file, the optional MongoDB driver."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import uuid
from pathlib import Path

import pytest

from stepstream.errors import ConfigError
from stepstream.sinks import DeepStore, RetentionStore, StepStore, open_deep_store, open_step_store
from stepstream.sinks.ports import Capabilities

from sink_support import COMPANY, MONGO_ENV, deep, drop_database, is_ferretdb, mongo_url, run, state, step


@pytest.mark.parametrize(
    "url",
    ["postgres://x/y", "redis://h", "stepstream.db", "", "sqlite:///", "sqlite:///:memory:", "file://", "FILE"],
)
async def test_an_unusable_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        await open_step_store(url)
    with pytest.raises(ConfigError):
        await open_deep_store(url)


async def test_every_backend_satisfies_the_protocols(tmp_path: Path) -> None:
    for url in ("memory://", f"file://{tmp_path}/f", f"sqlite:///{tmp_path}/s.db"):
        steps, deeps = await open_step_store(url), await open_deep_store(url)
        assert isinstance(steps, StepStore) and isinstance(deeps, DeepStore) and isinstance(deeps, RetentionStore)
        await steps.close()
        await deeps.close()


# What each backend reports, as docs/sinks.md says; the suite holds every False as a
# strict xfail or leaves the test out (listed under "capability gaps" in the summary).
DOCUMENTED_CAPABILITIES = {
    "memory": Capabilities(atomic_batch=True, shared_storage=False),
    "file": Capabilities(atomic_batch=False, shared_storage=True),
    "sqlite": Capabilities(atomic_batch=True, shared_storage=True),
    "mongodb": Capabilities(atomic_batch=False, shared_storage=True),
    "mongodb on FerretDB": Capabilities(
        atomic_batch=False, shared_storage=True, monotonic_states=False, atomic_reasoning=False
    ),
}


async def test_capabilities_are_the_documented_ones(
    backend: str, store_url: str, step_store: StepStore, deep_store: DeepStore
) -> None:
    server = " on FerretDB" if backend == "mongodb" and await is_ferretdb(store_url) else ""
    assert step_store.capabilities == deep_store.capabilities == DOCUMENTED_CAPABILITIES[backend + server]


async def test_the_mongodb_extra_missing_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pymongo", None)
    monkeypatch.delitem(sys.modules, "stepstream.sinks.mongodb", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'stepstream\[mongodb\]'"):
        await open_step_store("mongodb://127.0.0.1:1/x")
    monkeypatch.delitem(sys.modules, "stepstream.sinks.mongodb", raising=False)


async def test_file_sink_layout_and_torn_lines(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    steps, deeps = await open_step_store(url), await open_deep_store(url)
    await steps.write([step(0)], [run()], [state()])
    await deeps.write([deep(0, output='"a"')])
    assert sorted(p.name for p in tmp_path.glob("*.jsonl")) == [
        "deep-index.jsonl",
        "deep-trace.jsonl",
        "run-state.jsonl",
        "run-steps.jsonl",
        "runs.jsonl",
    ]

    # A writer killed mid-line leaves a torn tail: readers ignore it...
    trace = tmp_path / "deep-trace.jsonl"
    with trace.open("ab") as f:
        f.write(b'{"company_id":"acme","run_id":"r1","step_seq":1,"ki')
    assert [d.step_seq for d in await deeps.get_deep(COMPANY, "r1")] == [0]
    # ...and the next writer starts a fresh line, so the torn one stays one bad line.
    await deeps.write([deep(2, output='"c"')])
    other = await open_deep_store(url)
    assert [d.step_seq for d in await other.get_deep(COMPANY, "r1")] == [0, 2]
    assert other.bad_lines == 1  # type: ignore[attr-defined]
    lines = trace.read_bytes().split(b"\n")
    assert json.loads(lines[-2])["step_seq"] == 2
    # A purge rewrites the file without the run, torn garbage included.
    assert await other.purge_run(COMPANY, "r1") == 2
    assert trace.read_bytes() == b""
    assert await deeps.get_deep(COMPANY, "r1") == []
    for store in (steps, deeps, other):
        await store.close()


async def test_file_sink_purge_removes_the_bytes(tmp_path: Path) -> None:
    deeps = await open_deep_store(f"file://{tmp_path}")
    await deeps.write([deep(0, "keep", output='"visible"'), deep(0, "gone", output='"s3cr3t-canary"')])
    await deeps.purge_run(COMPANY, "gone")
    data = (tmp_path / "deep-trace.jsonl").read_bytes()
    assert b"s3cr3t-canary" not in data and b"visible" in data
    await deeps.close()


async def test_sqlite_steps_and_bodies_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "one.db"
    steps, deeps = await open_step_store(f"sqlite:///{path}"), await open_deep_store(f"sqlite:///{path}")
    await steps.write([step(0)], [run()], [state()])
    await deeps.write(
        [deep(0, kind="thinking", reasoning="x\x00y"), deep(0, kind="thinking", reasoning="z", reasoning_offset=2)]
    )
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"run_steps", "runs", "run_state", "run_step_details", "deep_runs"}
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        # Plain sqlite3 reads the bodies as written (NUL included).
        assert conn.execute("SELECT reasoning FROM run_step_details").fetchone() == ("x\x00z",)
    assert (await deeps.get_deep(COMPANY, "r1"))[0].reasoning == "x\x00z"
    await steps.close()
    await deeps.close()


async def test_sqlite_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    steps = await open_step_store("sqlite:///rel.db")
    await steps.close()
    assert (tmp_path / "rel.db").exists()


async def test_mongodb_purge_between_read_and_write_is_not_undone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MongoDB deep store merges positional reasoning onto the text it read; a
    purge landing between its read and its write must not bring the text back (its
    conditional write misses, and the read again finds the row gone)."""
    base = os.environ.get(MONGO_ENV)
    if not base:
        pytest.fail(f"{MONGO_ENV} is not set: run the suite via `make test`, which starts FerretDB")
    from stepstream.sinks.mongodb import MongoDeepStore

    url = mongo_url(base, f"stepstream_test_{uuid.uuid4().hex[:16]}")
    writer, purger = await open_deep_store(url), await open_deep_store(url)
    try:
        await writer.write([deep(0, kind="thinking", reasoning="s3cr3t head ")])
        read = MongoDeepStore._stored_reasoning

        purged: list[int] = []

        async def read_then_purge(self: MongoDeepStore, keys: list) -> dict:
            stored = await read(self, keys)
            if not purged:  # after the batch's read, not after the read again
                purged.append(await purger.purge_run(COMPANY, "r1"))
            return stored

        monkeypatch.setattr(MongoDeepStore, "_stored_reasoning", read_then_purge)
        await writer.write([deep(0, kind="thinking", reasoning="tail", reasoning_offset=12)])
        assert purged == [1]
        assert await writer.get_deep(COMPANY, "r1") == []
        monkeypatch.undo()
        await writer.write([deep(0, kind="thinking", reasoning="more", reasoning_offset=16)])
        assert [d.reasoning for d in await writer.get_deep(COMPANY, "r1")] == ["more"]
    finally:
        await writer.close()
        await purger.close()
        await drop_database(url)


def _fresh_mongo_url() -> str:
    base = os.environ.get(MONGO_ENV)
    if not base:
        pytest.fail(f"{MONGO_ENV} is not set: run the suite via `make test`, which starts FerretDB")
    return mongo_url(base, f"stepstream_test_{uuid.uuid4().hex[:16]}")


async def test_mongodb_a_late_state_is_refused_even_after_the_read_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stale owner read the stored states before the new owner wrote further
    (MongoDB has no transaction to hold them): its state write itself is refused."""
    from stepstream.sinks.mongodb import MongoStepStore

    url = _fresh_mongo_url()
    new_owner, old_owner = await open_step_store(url), await open_step_store(url)
    try:
        assert await new_owner.write([step(0, label="new")], [run(step_count=10)], [state(last_seq=10)]) == []

        async def read_before_the_new_owner_wrote(self: MongoStepStore, keys: list) -> dict:
            return {}

        monkeypatch.setattr(MongoStepStore, "_stored_last_seq", read_before_the_new_owner_wrote)
        skipped = await old_owner.write([step(1, label="old")], [run(step_count=7)], [state(last_seq=7)])
        assert skipped == [(COMPANY, "r1")]
        assert (await new_owner.load_states(COMPANY, ["r1"]))["r1"] == state(last_seq=10)
        # Still refused when the stored state is exactly as far (a replay that raced).
        assert await old_owner.write([], [], [state(last_seq=10, next_ordinal=99)]) == [(COMPANY, "r1")]
        assert (await new_owner.load_states(COMPANY, ["r1"]))["r1"] == state(last_seq=10)
        # A state ahead still goes through the conditional write.
        assert await old_owner.write([], [], [state(last_seq=11)]) == []
        assert (await new_owner.load_states(COMPANY, ["r1"]))["r1"] == state(last_seq=11)
    finally:
        await new_owner.close()
        await old_owner.close()
        await drop_database(url)


async def test_mongodb_reads_states_stored_before_last_seq_was_a_field() -> None:
    from pymongo import AsyncMongoClient

    from stepstream.sinks.mongodb import row_id

    url = _fresh_mongo_url()
    store = await open_step_store(url)
    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        old = state(last_seq=10, open_calls={"tool:a": 1})
        text = json.dumps({"company_id": COMPANY, "run_id": "r1", "last_seq": 10, "open_calls": {"tool:a": 1}})
        document = {"_id": row_id(COMPANY, "r1"), "company_id": COMPANY, "run_id": "r1", "state": text}
        await client.get_default_database()["run_state"].insert_one(document)
        assert await store.load_states(COMPANY, ["r1"]) == {"r1": old}
        assert await store.write([step(0, label="late")], [], [state(last_seq=9)]) == [(COMPANY, "r1")]
        assert await store.get_steps(COMPANY, "r1") == []
        assert await store.write([step(0, label="next")], [], [state(last_seq=11)]) == []
        assert await store.load_states(COMPANY, ["r1"]) == {"r1": state(last_seq=11)}
        doc = await client.get_default_database()["run_state"].find_one({"_id": row_id(COMPANY, "r1")})
        assert doc["last_seq"] == 11
    finally:
        await client.close()
        await store.close()
        await drop_database(url)


async def test_mongodb_states_written_after_the_read_by_another_writer_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs whose state another writer moved ahead between the batch's read and its
    state writes are refused, the others in the same command land (on FerretDB a bulk
    that collided is read back and finished one by one)."""
    from stepstream.sinks.mongodb import MongoStepStore

    url = _fresh_mongo_url()
    ours, theirs = await open_step_store(url), await open_step_store(url)
    try:
        runs = [f"r{i}" for i in range(20)]
        assert await ours.write([], [], [state(r, last_seq=1) for r in runs]) == []
        read = MongoStepStore._stored_last_seq

        async def read_then_overtake(self: MongoStepStore, keys: list) -> dict:
            stored = await read(self, keys)
            if self is ours:
                await theirs.write([], [], [state(r, last_seq=9) for r in ("r3", "r17")])
            return stored

        monkeypatch.setattr(MongoStepStore, "_stored_last_seq", read_then_overtake)
        refused = await ours.write([], [], [state(r, last_seq=5) for r in runs])
        monkeypatch.undo()
        assert refused == [(COMPANY, "r3"), (COMPANY, "r17")]
        got = await ours.load_states(COMPANY, runs)
        assert {r: s.last_seq for r, s in got.items()} == {r: 9 if r in ("r3", "r17") else 5 for r in runs}
    finally:
        await ours.close()
        await theirs.close()
        await drop_database(url)
