"""What the MongoDB adapter sends per batch (counted with pymongo's command
monitoring against the real server), and that its shortcuts keep the write
semantics when their read is out of date: a row the read found absent is
inserted, and updated instead if another writer created it meanwhile."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from pymongo import AsyncMongoClient, monitoring

from stepstream.sinks import DeepStore, StepStore, open_deep_store, open_step_store
from stepstream.sinks import mongodb

from sink_support import COMPANY, MONGO_ENV, deep, drop_database, mongo_url, run, state, step

RUNS = 30


class Commands(monitoring.CommandListener):
    """``(command, collection)`` of every command sent, counted."""

    def __init__(self) -> None:
        self.sent: Counter[tuple[str, str]] = Counter()
        self.find_filters: list[tuple[str, dict[str, Any]]] = []  # (collection, filter) of every find

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        target = event.command.get(event.command_name)
        self.sent[(event.command_name, target if isinstance(target, str) else "")] += 1
        if event.command_name == "find":
            self.find_filters.append((target, dict(event.command.get("filter", {}))))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def take(self) -> Counter[tuple[str, str]]:
        sent, self.sent = self.sent, Counter()
        self.find_filters = []
        return sent


@pytest.fixture
async def url() -> AsyncIterator[str]:
    base = os.environ.get(MONGO_ENV)
    if not base:
        pytest.fail(f"{MONGO_ENV} is not set: run the suite via `make test`, which starts FerretDB")
    url = mongo_url(base, f"stepstream_test_{uuid.uuid4().hex[:16]}")
    yield url
    await drop_database(url)


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> Commands:
    listener = Commands()

    def client(url: str, **options: Any) -> AsyncMongoClient:
        return AsyncMongoClient(url, event_listeners=[listener], **options)

    monkeypatch.setattr(mongodb, "AsyncMongoClient", client)
    return listener


@pytest.fixture
async def stores(url: str, commands: Commands) -> AsyncIterator[tuple[StepStore, DeepStore]]:
    steps, deeps = await open_step_store(url), await open_deep_store(url)
    yield steps, deeps
    await steps.close()
    await deeps.close()


def _finds(sent: Counter[tuple[str, str]]) -> dict[str, int]:
    return {collection: n for (name, collection), n in sent.items() if name in ("find", "getMore")}


async def test_a_many_runs_batch_reads_each_collection_once(
    stores: tuple[StepStore, DeepStore], commands: Commands
) -> None:
    steps, deeps = stores
    runs = [f"r{i}" for i in range(RUNS)]
    commands.take()
    await deeps.write([deep(0, r, kind="thinking", reasoning="abc") for r in runs])
    # New runs: no index entry, so no row below its high-water to read back.
    assert _finds(commands.take()) == {"deep_runs": 1}
    await steps.write([step(0, r) for r in runs], [run(r) for r in runs], [state(r, last_seq=1) for r in runs])
    assert _finds(commands.take()) == {"run_state": 1}
    assert len(await steps.load_states(COMPANY, runs)) == RUNS
    assert _finds(commands.take()) == {"run_state": 1}
    # The next batch of the same rows (below the high-water now): the index in one read,
    # the rows looked up by _id (FerretDB, up to FERRETDB_DEEP_LOOKUPS_MAX of them; else
    # one query), and the text merged.
    await deeps.write([deep(0, r, kind="thinking", reasoning="def", reasoning_offset=3) for r in runs])
    lookups = RUNS if deeps._conn.ferretdb and RUNS <= mongodb.FERRETDB_DEEP_LOOKUPS_MAX else 1
    assert _finds(commands.take()) == {"deep_runs": 1, "run_step_details": lookups}
    await steps.write([step(1, r) for r in runs], [run(r) for r in runs], [state(r, last_seq=2) for r in runs])
    assert _finds(commands.take()) == {"run_state": 1}
    assert {d.reasoning for r in runs for d in await deeps.get_deep(COMPANY, r)} == {"abcdef"}
    assert {len(await steps.get_steps(COMPANY, r)) for r in runs} == {2}


@pytest.mark.parametrize("companies", [3, 40])
async def test_the_reads_before_a_write_are_scoped_per_company(
    stores: tuple[StepStore, DeepStore], commands: Commands, companies: int
) -> None:
    """Each read of the write path names the companies it reads: one query per company
    (an equality, which FerretDB pushes down to PostgreSQL), at most
    ``READ_QUERIES_MAX`` per collection, the companies grouped past that; the deep
    rows below their run's high-water are looked up by ``_id`` on FerretDB (up to
    ``FERRETDB_DEEP_LOOKUPS_MAX``), else one query per run while the batch has at most
    ``READ_QUERIES_MAX`` runs. Each id is asked of its own company's (and run's) query
    alone."""
    steps, deeps = stores
    names = [f"co-{i:02d}" for i in range(companies)]
    keys = [(c, f"r{j}") for c in names for j in range(3)]  # 3 runs per company: past the one-by-one lookups
    commands.take()
    await deeps.write([deep(0, r, c, kind="thinking", reasoning="abc") for c, r in keys])
    await steps.write([step(0, r, c) for c, r in keys], [run(r, c) for c, r in keys],
                      [state(r, c, last_seq=1) for c, r in keys])  # fmt: skip
    most = mongodb.READ_QUERIES_MAX
    per_company = min(companies, most)
    first = commands.find_filters
    # New runs: no deep row below a high-water, none read back.
    assert _finds(commands.take()) == {"deep_runs": per_company, "run_state": per_company}
    # The same rows again (the reasoning goes on): now below the high-water, read back.
    await deeps.write([deep(0, r, c, kind="thinking", reasoning="def", reasoning_offset=3) for c, r in keys])
    second = commands.find_filters
    one_by_one = deeps._conn.ferretdb and len(keys) <= mongodb.FERRETDB_DEEP_LOOKUPS_MAX
    per_run = len(keys) if one_by_one or len(keys) <= most else per_company
    assert _finds(commands.take()) == {"deep_runs": per_company, "run_step_details": per_run}
    for filters, collection in ((first, "deep_runs"), (first, "run_state"), (second, "deep_runs"),
                                (second, "run_step_details")):  # fmt: skip
        asked: dict[str, str] = {}
        for name, where in filters:
            if name != collection:
                continue
            scope = where["company_id"]
            named = [scope] if isinstance(scope, str) else scope["$in"]
            if companies <= most:
                assert isinstance(scope, str), where  # one company: an equality
            if collection == "run_step_details" and len(keys) <= most and not one_by_one:
                assert isinstance(where.get("run_id"), str), where  # one run: an equality
            ids = [where["_id"]] if isinstance(where["_id"], str) else where["_id"]["$in"]  # by _id, or $in
            for _id in ids:
                assert _id not in asked, _id
                company, run_id = msgspec.json.decode(_id)[:2]
                assert company in named, (company, named)
                assert where.get("run_id", run_id) == run_id, (run_id, where)
                asked[_id] = company
        assert len(asked) == len(keys), (collection, len(asked))
    assert {d.reasoning for c, r in keys for d in await deeps.get_deep(c, r)} == {"abcdef"}


async def test_new_rows_are_inserted_not_updated(stores: tuple[StepStore, DeepStore], commands: Commands) -> None:
    """Rows the read found absent cost FerretDB no scan: none of them is an update."""
    steps, deeps = stores
    runs = [f"r{i}" for i in range(RUNS)]
    commands.take()
    await deeps.write([deep(0, r, arguments={"a": 1}) for r in runs])
    await steps.write(
        [step(0, r) for r in runs], [run(r) for r in runs], [state(r, last_seq=1, next_ordinal=1) for r in runs]
    )
    sent = commands.take()
    assert not [key for key in sent if key[0] == "update"], sent
    # Steps past the stored next_ordinal are new too; the run record and state are not.
    await steps.write([step(1, "r0")], [run("r0", step_count=2)], [state("r0", last_seq=2, next_ordinal=2)])
    assert {key: n for key, n in commands.take().items() if key[0] in ("insert", "update")} == {
        ("insert", "run_steps"): 1,
        ("update", "runs"): 1,
        ("update", "run_state"): 1,
    }


async def test_rows_created_after_the_read_are_updated_field_by_field(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that missed rows another writer created since (forced here): their
    insert collides on ``_id`` and the update applies, exactly as without the read."""
    steps, deeps = await open_step_store(url), await open_deep_store(url)
    try:
        await deeps.write([deep(0, arguments={"a": 1}, at=1)])
        await steps.write([step(0, label="first")], [run(step_count=1)], [state(last_seq=1, next_ordinal=1)])

        async def read_nothing(self: object, keys: object) -> dict:
            return {}

        monkeypatch.setattr(mongodb.MongoDeepStore, "_stored_reasoning", read_nothing)
        monkeypatch.setattr(mongodb.MongoDeepStore, "_index_entries", read_nothing)
        monkeypatch.setattr(mongodb.MongoStepStore, "_stored_last_seq", read_nothing)
        await deeps.write([deep(0, output="out", at=2)])
        assert await steps.write([step(0, status="ok")], [run(step_count=2)], [state(last_seq=2)]) == []
        monkeypatch.undo()

        [row] = await deeps.get_deep(COMPANY, "r1")
        assert (row.arguments, row.output, row.ts) == ({"a": 1}, "out", deep(0, at=2).ts)
        [entry] = await deeps.retention_index(COMPANY)
        assert entry.version == 2
        [got] = await steps.get_steps(COMPANY, "r1")
        assert (got.label, got.status) == ("first", "ok")
        assert (await steps.get_run(COMPANY, "r1")).step_count == 2
        assert (await steps.load_states(COMPANY, ["r1"]))["r1"] == state(last_seq=2)
    finally:
        await steps.close()
        await deeps.close()


def _plan_nodes(plan: dict[str, Any]) -> list[str]:
    """The node types of a PostgreSQL plan (EXPLAIN's JSON), outermost first."""
    return [plan.get("Node Type", ""), *(n for child in plan.get("Plans", []) for n in _plan_nodes(child))]


async def test_id_filter_is_served_by_an_index(url: str) -> None:
    """Every update and point read of the adapter filters on ``_id``. On FerretDB's
    PostgreSQL backend that filter is ``_jsonb->$1 @> $2``, which FerretDB's own btree
    ``_id`` index cannot serve: the test server adds a GIN index per table
    (``deploy/ferretdb/postgres.sh``), and this holds it to that (the plan of a point
    read among 3,000 documents uses an index; a scan would say ``Seq Scan``)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        db = client.get_default_database()
        build = await db.command("buildInfo")
        await db["probe"].insert_many([{"_id": mongodb.row_id(COMPANY, f"r{i}"), "n": i} for i in range(3_000)])
        explained = await db.command("explain", {"find": "probe", "filter": {"_id": mongodb.row_id(COMPANY, "r7")}})
        if "ferretdbVersion" not in build or "Plan" not in explained.get("queryPlanner", {}):
            return  # MongoDB serves _id itself; FerretDB on SQLite has no such plan (docs/sinks.md)
        nodes = _plan_nodes(explained["queryPlanner"]["Plan"])
        assert any("Index" in node for node in nodes), nodes
        assert await db["probe"].find_one({"_id": mongodb.row_id(COMPANY, "r7")}) == {
            "_id": mongodb.row_id(COMPANY, "r7"), "n": 7
        }
    finally:
        await client.close()
