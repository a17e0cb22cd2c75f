"""Sink benchmark: the SQLite (and MongoDB) sink against the bare driver, side by side.

    PYTHONPATH=services python -m benchmarks.bench_sinks [--batches 60] [--rounds 3]
        [--mongo mongodb://127.0.0.1:27017/] [--mongo-batches 10] [--mongo-rounds 1]

The workload is what the worker writes (generated, seeded): 200 runs interleaved,
each a sequence of thinking steps of 2-24 KB flushed in 2 KiB positional chunks
(a deep reasoning chunk plus a rewrite of the thinking step per flush) and tool
calls (a step written running then completed, raw arguments of 0.2-4 KB and raw
output of 1-60 KB on the deep row), plus the run record and the run state of every
run a batch touches. Batches hold ~500 rows after coalescing by key exactly as the
worker's pipeline does (``core.merge``: one step row per key, adjacent reasoning
chunks of a step joined), so both sides write what the worker would hand the sink.

* **sink**: ``SqliteDeepStore.write(deeps)`` then ``SqliteStepStore.write(steps,
  runs, states)`` per batch, as the worker does (port clip, msgspec conversion,
  upserts with the merge, one transaction per call, aiosqlite).
* **bare**: plain ``sqlite3`` on the same schema and PRAGMAs, the same rows as
  ready-made tuples, ``INSERT OR REPLACE`` via ``executemany``, one transaction
  per batch. It stores each reasoning *chunk* (no positional merge).
* **bare_as_stored**: the same, but each reasoning row carries the whole text the
  sink stores after that write (``stored[:offset] + chunk``). The positional merge
  rewrites a thinking step's accumulated text on every flush (about 5x the chunk
  bytes in this mix); ``ratio_as_stored`` shows the sink's own overhead once that
  inherent cost is on both sides.

Each round runs both on fresh files, interleaved; the best round of each counts.
``ratio`` is sink rows/s over bare rows/s (the aim is >= 0.8). With ``--mongo`` or
``STEPSTREAM_TEST_MONGO_URL``, the same for the MongoDB sink against a bare
pymongo loop doing the same logical writes: per batch and collection one unordered
``bulk_write`` of ``UpdateOne({_id}, {$set: fields}, upsert)`` of the documents the
sink leaves (reasoning merged ahead, as stored), the same write concern, no reads; and
the commands, operations and BSON bytes per row each side sends (counted by a pymongo
command listener on a pass of its own over the first two batches).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.pipeline import RowBatch
from stepstream.sinks import open_deep_store, open_step_store
from stepstream.sinks.sqlite_operations import deep_schema, step_schema

CHUNK = 2048
# RunRecord's field order: environment, status, failure are stored as text, in this order.
ENVIRONMENT = RunRecord.__struct_fields__.index("environment")
assert RunRecord.__struct_fields__[ENVIRONMENT : ENVIRONMENT + 3] == ("environment", "status", "failure")
BATCH_ROWS = 500


class Batch(msgspec.Struct):
    deeps: list[DeepRecord]
    steps: list[StepRecord]
    runs: list[RunRecord]
    states: list[RunState]

    @property
    def rows(self) -> int:
        return len(self.deeps) + len(self.steps) + len(self.runs) + len(self.states)


def _ts(n: int) -> str:
    """Microsecond ``n`` of 2026-01-01 as RFC 3339 UTC."""
    hours, minutes, seconds = n // 3_600_000_000 % 24, n // 60_000_000 % 60, n // 1_000_000 % 60
    return f"2026-01-01T{hours:02d}:{minutes:02d}:{seconds:02d}.{n % 1_000_000:06d}Z"


class _Run:
    def __init__(self, company: str, run_id: str) -> None:
        self.record = RunRecord(company_id=company, run_id=run_id, agent_name="bench", started_at=_ts(0))
        self.ordinal = 0
        self.seq = 0
        self.pending: Iterator[list[DeepRecord | StepRecord]] | None = None


def workload(seed: int, batches: int, runs: int = 200) -> list[Batch]:
    """``batches`` batches of ~500 rows from ``runs`` interleaved runs (see the module doc)."""
    rng = random.Random(seed)
    pool = "".join(rng.choice("abcdefghij klmnopqrstuvwxyz.,\n") for _ in range(70_000)) + "é日\U0001f600" * 100
    clock = [0]

    def text(n: int) -> str:
        start = rng.randrange(0, len(pool) - n) if n < len(pool) else 0
        return (pool * (n // len(pool) + 1))[start : start + n] if n >= len(pool) else pool[start : start + n]

    def tick() -> str:
        clock[0] += rng.randrange(100, 5000)
        return _ts(clock[0])

    def thinking(run: _Run) -> Iterator[list[DeepRecord | StepRecord]]:
        c, r, ordinal = run.record.company_id, run.record.run_id, run.ordinal
        run.ordinal += 1
        total = rng.randrange(2_000, 24_000)
        started = tick()
        for offset in range(0, total, CHUNK):
            now = tick()
            yield [
                DeepRecord(
                    company_id=c,
                    run_id=r,
                    step_seq=ordinal,
                    kind="thinking",
                    ts=now,
                    reasoning=text(min(CHUNK, total - offset)),
                    reasoning_offset=offset,
                ),
                StepRecord(
                    company_id=c,
                    run_id=r,
                    step_seq=ordinal,
                    kind="thinking",
                    label="thinking",
                    status="running",
                    started_at=started,
                    ended_at=now,
                ),
            ]

    def tool(run: _Run) -> Iterator[list[DeepRecord | StepRecord]]:
        c, r, ordinal = run.record.company_id, run.record.run_id, run.ordinal
        run.ordinal += 1
        started, args = tick(), text(rng.randrange(200, 4_000))
        yield [
            StepRecord(
                company_id=c,
                run_id=r,
                step_seq=ordinal,
                kind="tool",
                label="read_file",
                status="running",
                call_id=f"call-{ordinal}",
                arguments={"path": "/srv/app/main.py", "lines": [1, 400]},
                input_shape="2 fields",
                started_at=started,
            ),
            DeepRecord(company_id=c, run_id=r, step_seq=ordinal, kind="tool", ts=started, arguments=args),
        ]
        ended = tick()
        yield [
            StepRecord(
                company_id=c,
                run_id=r,
                step_seq=ordinal,
                kind="tool",
                status="ok",
                output_shape="4.2k characters",
                ended_at=ended,
            ),
            DeepRecord(
                company_id=c,
                run_id=r,
                step_seq=ordinal,
                kind="tool",
                ts=ended,
                output=text(rng.randrange(1_000, 60_000)),
            ),
        ]

    def script(run: _Run) -> Iterator[list[DeepRecord | StepRecord]]:
        for _ in range(rng.randrange(6, 20)):
            yield from thinking(run)
            yield from tool(run)

    active = [_Run(f"co-{i % 4}", f"run-{seed}-{i}") for i in range(runs)]
    for run in active:
        run.pending = script(run)
    made = runs
    out: list[Batch] = []
    while len(out) < batches:
        batch = RowBatch()
        touched: dict[int, _Run] = {}
        while len(batch) + 2 * len(touched) < BATCH_ROWS:
            i = rng.randrange(len(active))
            run = active[i]
            unit = next(run.pending, None) if run.pending is not None else None
            if unit is None:
                active[i] = _Run(f"co-{made % 4}", f"run-{seed}-{made}")
                active[i].pending = script(active[i])
                made += 1
                continue
            for record in unit:
                if isinstance(record, StepRecord):
                    batch.add_step(record)
                else:
                    batch.add_deep(record)
            run.seq += 1
            run.record = msgspec.structs.replace(run.record, step_count=run.ordinal, last_event_at=_ts(clock[0]))
            touched[id(run)] = run
        runs_, states = [], []
        for run in touched.values():
            runs_.append(run.record)
            states.append(
                RunState(
                    company_id=run.record.company_id,
                    run_id=run.record.run_id,
                    last_seq=run.seq,
                    next_ordinal=run.ordinal,
                    run=run.record,
                )
            )
        out.append(Batch(batch.deeps, list(batch.steps.values()), runs_, states))
    return out


# --- SQLite ---------------------------------------------------------------------------------

_json = msgspec.json.Encoder()


_DEEP_TABLE = tuple(f for f in DeepRecord.__struct_fields__ if f != "reasoning_offset")


def _text(value: Any) -> str | None:
    """A structured field as the sinks store it: its JSON text."""
    return None if value is None else _json.encode(value).decode()


def _bare_rows(batches: list[Batch], *, as_stored: bool = False) -> list[dict[str, list[tuple[Any, ...]]]]:
    """The same rows as ready-made tuples for plain sqlite3 (prepared outside the timing).
    ``as_stored``: each reasoning row carries the whole text the sink stores after that
    write (``stored[:offset] + chunk``) instead of the chunk."""
    astuple = msgspec.structs.astuple
    text: dict[tuple[str, str, int], str] = {}
    out = []
    for b in batches:
        deeps = []
        for d in b.deeps:
            reasoning = d.reasoning
            if as_stored and reasoning is not None:
                key = (d.company_id, d.run_id, d.step_seq)
                reasoning = text[key] = text.get(key, "")[: d.reasoning_offset] + reasoning
            # The table's columns, in order: the record's fields but the reasoning offset;
            # bodies and envelopes as JSON text.
            values = {**{f: getattr(d, f) for f in _DEEP_TABLE}, "reasoning": reasoning, "clipped": int(d.clipped)}
            for f in ("arguments", "output", "call_event", "result_event"):
                values[f] = _text(values[f])
            deeps.append(tuple(values[f] for f in _DEEP_TABLE))
        out.append(
            {
                "run_step_details": deeps,
                "run_steps": [
                    (
                        *astuple(s)[:7],
                        _json.encode(s.arguments).decode() if s.arguments is not None else None,
                        *astuple(s)[8:],
                    )
                    for s in b.steps
                ],
                "runs": [
                    (*astuple(r)[:ENVIRONMENT], _text(r.environment), r.status, _text(r.failure),
                     *astuple(r)[ENVIRONMENT + 3 :], r.started_at or r.last_event_at or "")
                    for r in b.runs
                ],  # fmt: skip
                "run_state": [(s.company_id, s.run_id, _json.encode(s).decode()) for s in b.states],
            }
        )
    return out


def _bare_sqlite(path: Path, rows: list[dict[str, list[tuple[Any, ...]]]]) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # the sink's default durability
    conn.executescript(step_schema() + deep_schema())
    sql = {
        table: f"INSERT OR REPLACE INTO {table} VALUES ({', '.join('?' * len(sample[0]))})"
        for table, sample in rows[0].items()
        if sample
    }
    started = time.perf_counter()
    for batch in rows:
        conn.execute("BEGIN IMMEDIATE")
        for table, params in batch.items():
            if params:
                conn.executemany(sql[table], params)
        conn.execute("COMMIT")
    took = time.perf_counter() - started
    conn.close()
    return took


async def _sink(steps_url: str, deep_url: str, batches: list[Batch]) -> float:
    steps, deep = await open_step_store(steps_url), await open_deep_store(deep_url)
    started = time.perf_counter()
    for b in batches:
        await deep.write(b.deeps)
        await steps.write(b.steps, b.runs, b.states)
    took = time.perf_counter() - started
    await steps.close()
    await deep.close()
    return took


def bench_sqlite(batches: list[Batch], rounds: int) -> dict[str, float]:
    rows = sum(b.rows for b in batches)
    bare_rows, stored_rows = _bare_rows(batches), _bare_rows(batches, as_stored=True)
    best_sink = best_bare = best_stored = float("inf")
    with tempfile.TemporaryDirectory(prefix="bench-sinks-") as tmp:
        for i in range(rounds):
            gc.collect()
            best_bare = min(best_bare, _bare_sqlite(Path(tmp) / f"bare-{i}.db", bare_rows))
            gc.collect()
            best_stored = min(best_stored, _bare_sqlite(Path(tmp) / f"stored-{i}.db", stored_rows))
            gc.collect()
            url = f"sqlite:///{Path(tmp) / f'sink-{i}.db'}"
            best_sink = min(best_sink, asyncio.run(_sink(url, url, batches)))
    return {
        "rows": rows,
        "sink": rows / best_sink,
        "bare": rows / best_bare,
        "ratio": best_bare / best_sink,
        "bare_as_stored": rows / best_stored,
        "ratio_as_stored": best_stored / best_sink,
    }


# --- MongoDB --------------------------------------------------------------------------------


def _mongo_db_url(base: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def _bare_mongo_writes(batches: list[Batch]) -> list[dict[str, list[tuple[str, dict[str, Any]]]]]:
    """Per batch and collection, ``(_id, fields)`` of the documents the sink leaves
    after that batch (prepared outside the timing): the batch's writes to a row
    coalesced (later non-None fields win), each reasoning row carrying its whole text
    as stored after the batch (the positional merge done ahead), bodies, arguments
    and the environment as JSON text, states as their JSON text and ``last_seq``."""
    text: dict[tuple[str, str, int], str] = {}
    out = []
    for b in batches:
        deeps: dict[str, dict[str, Any]] = {}
        for d in b.deeps:
            key = (d.company_id, d.run_id, d.step_seq)
            fields = deeps.setdefault(_json.encode(key).decode(), {})
            fields.update({k: v for k, v in msgspec.to_builtins(d).items() if k != "reasoning_offset"})
            for name in ("arguments", "output", "call_event", "result_event"):
                if getattr(d, name) is not None:
                    fields[name] = _text(getattr(d, name))
            if d.reasoning is not None:
                stored = text.get(key)
                fields["reasoning"] = text[key] = (
                    d.reasoning if not stored else stored[: d.reasoning_offset] + d.reasoning + stored[d.reasoning_offset + len(d.reasoning) :]
                )
        steps: dict[str, dict[str, Any]] = {}
        for st in b.steps:
            fields = msgspec.to_builtins(st)
            if st.arguments is not None:
                fields["arguments"] = _json.encode(st.arguments).decode()
            steps.setdefault(_json.encode((st.company_id, st.run_id, st.step_seq)).decode(), {}).update(fields)
        runs = {}
        for r in b.runs:
            doc = msgspec.to_builtins(msgspec.structs.asdict(r))
            doc["environment"] = _text(r.environment)
            doc["recency"] = r.started_at or r.last_event_at or ""
            runs[_json.encode((r.company_id, r.run_id)).decode()] = {k: v for k, v in doc.items() if v is not None}
        states = {
            _json.encode((st.company_id, st.run_id)).decode(): {
                "company_id": st.company_id, "run_id": st.run_id, "last_seq": st.last_seq, "state": _json.encode(st).decode()
            }
            for st in b.states
        }  # fmt: skip
        out.append({name: list(rows.items()) for name, rows in
                    (("run_step_details", deeps), ("run_steps", steps), ("runs", runs), ("run_state", states))})  # fmt: skip
    return out


async def _bare_mongo(url: str, batches: list[Batch]) -> float:
    """The same logical writes with plain pymongo: per batch and collection one
    unordered ``bulk_write`` of ``UpdateOne({_id}, {$set: fields}, upsert)``, deep rows
    first, states last, the sink's write concern (``w=majority, j=true``), no reads
    (no conditions: this is the ceiling of what the server takes for these documents)."""
    from stepstream.sinks.mongodb import FERRETDB_UPDATES_PER_COMMAND

    from pymongo import AsyncMongoClient, UpdateOne
    from pymongo.write_concern import WriteConcern

    writes = _bare_mongo_writes(batches)
    client: AsyncMongoClient = AsyncMongoClient(url)
    db = client.get_default_database(write_concern=WriteConcern(w="majority", j=True))
    try:
        # FerretDB 1.24 deadlocks on long update commands (the sink's module doc): there,
        # both sides send at most the sink's statements per command.
        ferretdb = "ferretdbVersion" in await db.command("buildInfo")
        step = FERRETDB_UPDATES_PER_COMMAND if ferretdb else 100_000
        started = time.perf_counter()
        for batch in writes:
            for collection, rows in batch.items():
                ops = [UpdateOne({"_id": _id}, {"$set": fields}, upsert=True) for _id, fields in rows]
                for at in range(0, len(ops), step):
                    await db[collection].bulk_write(ops[at : at + step], ordered=False)
        took = time.perf_counter() - started
        await client.drop_database(db.name)
    finally:
        await client.close()
    return took


class Traffic:
    """A pymongo command listener counting the commands a client sends, the
    operations (statements or documents) in them and their BSON bytes, by command."""

    def __init__(self) -> None:
        self.commands: dict[str, int] = {}
        self.operations = 0
        self.bytes = 0

    def started(self, event: Any) -> None:
        import bson

        name = event.command_name
        if name in ("ping", "buildInfo", "createIndexes", "dropDatabase", "endSessions", "hello", "isMaster"):
            return
        self.commands[name] = self.commands.get(name, 0) + 1
        command = event.command
        self.operations += len(command.get("updates") or command.get("documents") or command.get("deletes") or [1])
        self.bytes += len(bson.encode(command))

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass

    def total(self) -> int:
        return sum(self.commands.values())


_counting: list[Traffic] = []  # the Traffic that the one registered listener feeds, if any


def _register_listener() -> None:
    """pymongo listeners are global (and cannot be removed): one, registered once,
    forwards to whatever :class:`Traffic` is counting."""
    from pymongo import monitoring

    if getattr(_register_listener, "done", False):
        return

    class _Forward(monitoring.CommandListener):
        def started(self, event: Any) -> None:
            if _counting:
                _counting[0].started(event)

        def succeeded(self, event: Any) -> None:
            pass

        def failed(self, event: Any) -> None:
            pass

    monitoring.register(_Forward())
    _register_listener.done = True  # type: ignore[attr-defined]


async def count_traffic(run: Any) -> Traffic:
    """The commands, operations and bytes that awaiting ``run()`` sends."""
    _register_listener()
    traffic = Traffic()
    _counting[:] = [traffic]
    try:
        await run()
    finally:
        _counting.clear()
    return traffic


async def _drop(url: str) -> None:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        await client.drop_database(client.get_default_database().name)
    finally:
        await client.close()


async def _bench_mongo(base: str, batches: list[Batch], rounds: int) -> dict[str, float]:
    rows = sum(b.rows for b in batches)
    best_sink = best_bare = float("inf")
    for _ in range(rounds):
        tag = uuid.uuid4().hex[:8]
        best_bare = min(best_bare, await _bare_mongo(_mongo_db_url(base, f"bench_bare_{tag}"), batches))
        url = _mongo_db_url(base, f"bench_sink_{tag}")
        try:
            best_sink = min(best_sink, await _sink(url, url, batches))
        finally:
            await _drop(url)
    figures = {"rows": rows, "sink": rows / best_sink, "bare": rows / best_bare, "ratio": best_bare / best_sink}
    # Traffic, counted on a pass of its own (encoding every command to count its
    # bytes would weigh on the timing): the first two batches, fresh databases.
    sample = batches[:2]
    sample_rows = sum(b.rows for b in sample)
    tag = uuid.uuid4().hex[:8]
    url = _mongo_db_url(base, f"bench_sink_{tag}")
    try:
        sink = await count_traffic(lambda: _sink(url, url, sample))
    finally:
        await _drop(url)
    bare = await count_traffic(lambda: _bare_mongo(_mongo_db_url(base, f"bench_bare_{tag}"), sample))
    for name, traffic in (("sink", sink), ("bare", bare)):
        figures[f"{name}_commands_per_row"] = traffic.total() / sample_rows
        figures[f"{name}_operations_per_row"] = traffic.operations / sample_rows
        figures[f"{name}_bytes_per_row"] = traffic.bytes / sample_rows
        figures[f"{name}_commands"] = traffic.commands  # type: ignore[assignment]
    return figures


def _report(name: str, figures: dict[str, float], batches: list[Batch]) -> None:
    deep = sum(len(b.deeps) for b in batches)
    print(f"{name}: {int(figures['rows'])} rows in {len(batches)} batches ({deep} deep)", file=sys.stderr)
    print(f"{name}.sink_rows_per_s {figures['sink']:.0f}")
    print(f"{name}.bare_rows_per_s {figures['bare']:.0f}")
    print(f"{name}.ratio {figures['ratio']:.2f}")
    for side in ("sink", "bare"):
        if f"{side}_commands_per_row" in figures:
            print(f"{name}.{side}_commands_per_row {figures[f'{side}_commands_per_row']:.3f}")
            print(f"{name}.{side}_operations_per_row {figures[f'{side}_operations_per_row']:.3f}")
            print(f"{name}.{side}_bytes_per_row {figures[f'{side}_bytes_per_row']:.0f}")
            print(f"{name}: {side} commands in the counted batches: {figures[f'{side}_commands']}", file=sys.stderr)
    if "bare_as_stored" in figures:
        print(f"{name}.bare_as_stored_rows_per_s {figures['bare_as_stored']:.0f}")
        print(f"{name}.ratio_as_stored {figures['ratio_as_stored']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--mongo",
        default=os.environ.get("STEPSTREAM_TEST_MONGO_URL"),
        help="MongoDB URL (default: $STEPSTREAM_TEST_MONGO_URL)",
    )
    parser.add_argument("--mongo-batches", type=int, default=10, help="the first N batches (FerretDB is slow)")
    parser.add_argument("--mongo-rounds", type=int, default=1)
    args = parser.parse_args(argv)

    batches = workload(args.seed, args.batches)
    _report("sqlite", bench_sqlite(batches, args.rounds), batches)
    if args.mongo:
        mongo_batches = batches[: args.mongo_batches]
        _report("mongodb", asyncio.run(_bench_mongo(args.mongo, mongo_batches, args.mongo_rounds)), mongo_batches)
    else:
        print("mongodb: skipped (no --mongo URL and no STEPSTREAM_TEST_MONGO_URL)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
