"""The store's ceiling: the worker into MongoDB beside a bare pymongo loop replaying
exactly what the worker wrote, on the same server, in one run.

    deploy/with-servers.sh -- .venv/bin/python -m benchmarks.bench_ceiling [--mongo URL] [--rounds 3] [--quick]

Per corpus (thinking-heavy and many-runs, the sizes of ``bench_capacity``'s):

1. **recorded**: the worker's write path (``recording_worker``: ``ingest_file``, the
   worker's pipeline and MongoDB sink without Kafka or faust) into a fresh database,
   with every command it sends recorded: its reads, and its write commands whole
   (the documents, the update statements and their filters, the write concern).
2. Then ``--rounds`` rounds, interleaved, each on fresh databases:

   * **worker**: the same ingest again, nothing recorded: events/s (wall), the
     client's CPU per event (decode, fold, sink, driver), the server's CPU per event;
   * **bare**: plain pymongo replaying the recorded write commands in order, no reads
     and no decisions: consecutive commands to one collection of one kind are joined
     into unordered bulks (``insert_many``; ``bulk_write`` of the recorded
     ``UpdateOne``/``ReplaceOne`` upserts and filters; deletes), at most
     ``FERRETDB_UPDATES_PER_COMMAND`` update statements per command on FerretDB (its
     deadlock, see the sink's module doc) and never two statements on one ``_id`` in
     one bulk; the recorded write concern; the sink's indexes created beforehand.
     Events/s is the corpus's events over the replay's time. Its database is then
     compared with the recorded one, document by document (``replay_equal``).

With ``--prefill K``, every database (recorded, worker, bare) first gets the same
documents, K times the corpus's runs of another seed in the same companies (ingested
once the worker's way, recorded, and replayed into each): a store that already holds
data, where a read the store answers by decoding a company's documents costs more.

Printed per corpus and round: both rates, ``worker_over_bare``, CPU us per event of
each side (client and server), and once per corpus the store traffic per event:
commands, operations (read queries; write statements) and BSON bytes sent (and the
bytes the worker's reads bring back), of the worker and of the bare loop (whose bytes are those of the recorded write commands). A
ratio near 1 says the sink adds little to its writes; a bare rate below a goal says
that no sink sending these writes can reach it on this server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.bench_capacity import CORE_SHARE, model
from benchmarks.bench_sinks import _drop, _mongo_db_url
from benchmarks.recording_worker import Recording, WriteCommand, record_ingest, timed_ingest
from benchmarks.server_cpu import ServerCpu
from stepstream.core.wire import encode_event
from stepstream.emitter.corpus import generate_events, generate_many_runs

GOALS = {"thinking-heavy": 15_000, "many-runs": 5_000}  # events/s per worker (issue 22)


def corpora(quick: bool, *, seed: int = 1, scale: float = 1.0) -> dict[str, list[Any]]:
    """bench_capacity's corpora (``--quick``: smaller; ``scale`` times as many runs)."""
    return {
        "thinking-heavy": generate_events(seed, runs=round((30 if quick else 100) * scale), companies=5),
        "many-runs": generate_many_runs(seed, runs=round((300 if quick else 1500) * scale), companies=8),
    }


# --- the bare replay ------------------------------------------------------------------


def _statement_id(kind: str, statement: dict[str, Any]) -> Any:
    """The ``_id`` a statement writes (``None``: not a single-``_id`` statement)."""
    if kind == "insert":
        return statement.get("_id")
    where = statement.get("q", {})
    _id = where.get("_id")
    return None if isinstance(_id, dict) else _id


def _operation(kind: str, statement: dict[str, Any]) -> Any:
    from pymongo import DeleteMany, DeleteOne, ReplaceOne, UpdateMany, UpdateOne

    if kind == "delete":
        return (DeleteOne if statement.get("limit") == 1 else DeleteMany)(statement["q"])
    update, upsert = statement["u"], bool(statement.get("upsert"))
    if isinstance(update, dict) and update and not next(iter(update)).startswith("$"):
        return ReplaceOne(statement["q"], update, upsert=upsert)
    return (UpdateMany if statement.get("multi") else UpdateOne)(statement["q"], update, upsert=upsert)


class Bulk:
    """One command of the replay: ``kind`` statements to ``collection``."""

    __slots__ = ("collection", "kind", "statements", "ids")

    def __init__(self, collection: str, kind: str) -> None:
        self.collection, self.kind = collection, kind
        self.statements: list[Any] = []
        self.ids: set[Any] = set()


def replay_plan(writes: list[WriteCommand], *, ferretdb: bool) -> list[Bulk]:
    """The recorded write commands as the bare loop's bulks (see the module doc), with
    the pymongo operations built ahead (outside the timing)."""
    from stepstream.sinks.mongodb import FERRETDB_UPDATES_PER_COMMAND

    most = FERRETDB_UPDATES_PER_COMMAND if ferretdb else 100_000
    plan: list[Bulk] = []

    def fits(bulk: Bulk, kind: str, collection: str, _id: Any) -> bool:
        if bulk.kind != kind or bulk.collection != collection or _id is None or _id in bulk.ids:
            return False
        return kind == "insert" or len(bulk.statements) < most

    for command in writes:
        for statement in command.statements:
            _id = _statement_id(command.kind, statement)
            if not plan or not fits(plan[-1], command.kind, command.collection, _id):
                plan.append(Bulk(command.collection, command.kind))
            bulk = plan[-1]
            bulk.statements.append(statement if command.kind == "insert" else _operation(command.kind, statement))
            if _id is not None:
                bulk.ids.add(_id)
    return plan


async def bare_replay(url: str, recording: Recording, ferretdb: bool) -> dict[str, float]:
    """Replay ``recording``'s writes into the fresh database of ``url``: seconds, CPU
    seconds of this process, commands sent. The sink's indexes are made first."""
    from pymongo import AsyncMongoClient
    from pymongo.errors import BulkWriteError
    from pymongo.write_concern import WriteConcern

    from stepstream.sinks.mongodb import DEEP_INDEXES, STEP_INDEXES

    plan = replay_plan(recording.writes, ferretdb=ferretdb)
    concern = recording.write_concern()
    client: AsyncMongoClient = AsyncMongoClient(url)
    errors = 0
    try:
        db = client.get_default_database(write_concern=WriteConcern(**concern) if concern else None)
        for collection, specs in {**STEP_INDEXES, **DEEP_INDEXES}.items():
            for keys, options in specs:
                await db[collection].create_index(keys, **options)
        collections = {bulk.collection: db[bulk.collection] for bulk in plan}
        # Documents are copied per replay: insert_many would otherwise share them between rounds.
        inserts = {id(bulk): [dict(doc) for doc in bulk.statements] for bulk in plan if bulk.kind == "insert"}
        cpu, wall = time.process_time(), time.perf_counter()
        for bulk in plan:
            try:
                if bulk.kind == "insert":
                    await collections[bulk.collection].insert_many(inserts[id(bulk)], ordered=False)
                else:
                    await collections[bulk.collection].bulk_write(bulk.statements, ordered=False)
            except BulkWriteError as exc:  # counted: the replay of a single writer should have none
                errors += len(exc.details.get("writeErrors", []))
        seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await client.close()
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "commands": len(plan), "errors": errors}


async def _contents(url: str) -> dict[str, list[dict[str, Any]]]:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        db = client.get_default_database()
        out = {}
        for name in sorted(await db.list_collection_names()):
            out[name] = await db[name].find({}).sort("_id", 1).to_list()
        return out
    finally:
        await client.close()


def _differences(recorded: dict[str, list[dict[str, Any]]], replayed: dict[str, list[dict[str, Any]]]) -> int:
    """Documents that differ (present on one side only, or unequal), over every collection."""
    differ = 0
    for name in set(recorded) | set(replayed):
        a = {d["_id"]: d for d in recorded.get(name, [])}
        b = {d["_id"]: d for d in replayed.get(name, [])}
        differ += sum(1 for _id in set(a) | set(b) if a.get(_id) != b.get(_id))
    return differ


# --- the run --------------------------------------------------------------------------


def _server_seconds(server: ServerCpu | None) -> float:
    return sum(server.seconds().values()) if server else float("nan")


async def _ferretdb(url: str) -> bool:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient = AsyncMongoClient(url)
    try:
        return "ferretdbVersion" in await client.admin.command("buildInfo")
    finally:
        await client.close()


def _fresh(base: str, what: str) -> str:
    return _mongo_db_url(base, f"bench_ceiling_{what}_{uuid.uuid4().hex[:8]}")


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def traffic(name: str, recording: Recording, bare_commands: int) -> Iterator[str]:
    n = recording.events
    reads = recording.read_statements
    yield f"ceiling.{name}.events {n}"
    yield (f"ceiling.{name}.worker_commands_per_event {recording.commands / n:.3f} "
           f"(reads {sum(recording.reads.values()) / n:.3f}: {dict(sorted(recording.reads.items()))}; "
           f"writes {len(recording.writes) / n:.3f})")  # fmt: skip
    yield f"ceiling.{name}.worker_operations_per_event {(reads + recording.write_statements) / n:.3f}"
    yield f"ceiling.{name}.worker_write_statements_per_event {recording.write_statements / n:.3f}"
    yield f"ceiling.{name}.worker_bytes_per_event {(recording.read_bytes + recording.write_bytes) / n:.0f}"
    yield f"ceiling.{name}.worker_read_bytes_per_event {recording.read_bytes / n:.0f}"
    yield f"ceiling.{name}.worker_read_reply_bytes_per_event {recording.reply_bytes / n:.0f} (the documents read back)"
    yield f"ceiling.{name}.bare_commands_per_event {bare_commands / n:.3f}"
    yield f"ceiling.{name}.bare_operations_per_event {recording.write_statements / n:.3f}"
    yield f"ceiling.{name}.bare_bytes_per_event {recording.write_bytes / n:.0f}"
    kinds: dict[str, int] = {}
    for w in recording.writes:
        key = f"{w.kind} {w.collection}"
        kinds[key] = kinds.get(key, 0) + len(w.statements)
    yield f"ceiling.{name}.write_statements_by_collection {dict(sorted(kinds.items()))}"


async def _prefill(base: str, events: list[Any], tmp: Path) -> Recording | None:
    """The writes of ``events`` ingested into a scratch database (then dropped): what
    each database of the run is given first, replayed, so that all start equal."""
    if not events:
        return None
    path = tmp / "prefill.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    url = _fresh(base, "prefill")
    try:
        return await record_ingest(path, url, events=len(events))
    finally:
        await _drop(url)


async def corpus_run(
    base: str, name: str, events: list[Any], rounds: int, tmp: Path, prefill: list[Any] = ()
) -> dict[str, list[float]]:
    path = tmp / f"{name}.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    n = len(events)
    ferretdb = await _ferretdb(base)
    server = ServerCpu.find(base)
    stored = await _prefill(base, list(prefill), tmp)

    async def fresh(what: str) -> str:
        url = _fresh(base, what)
        if stored is not None:
            await bare_replay(url, stored, ferretdb)
        return url

    if stored is not None:
        print(f"ceiling.{name}.prefill {len(prefill)} events of other runs in the same companies, "
              "in every database before the timed passes", flush=True)  # fmt: skip
    recorded_url = await fresh("recorded")
    results: dict[str, list[float]] = {"worker": [], "bare": [], "ratio": [], "cpu": [], "server": []}
    try:
        recording = await record_ingest(path, recorded_url, events=n)
        recorded = await _contents(recorded_url)
        plan_commands = len(replay_plan(recording.writes, ferretdb=ferretdb))
        for line in traffic(name, recording, plan_commands):
            print(line, flush=True)
        for round_ in range(rounds):
            worker_url, bare_url = await fresh("worker"), await fresh("bare")
            try:
                before = _server_seconds(server)
                worker = await timed_ingest(path, worker_url, events=n)
                worker_server = _server_seconds(server) - before
                before = _server_seconds(server)
                bare = await bare_replay(bare_url, recording, ferretdb)
                bare_server = _server_seconds(server) - before
                differ = _differences(recorded, await _contents(bare_url))
            finally:
                await _drop(worker_url)
                await _drop(bare_url)
            worker_rate, bare_rate = n / worker.seconds, n / bare["seconds"]
            results["worker"].append(worker_rate)
            results["cpu"].append(worker.cpu_seconds / n * 1e6)
            results["server"].append(worker_server / n * 1e6)
            results["bare"].append(bare_rate)
            results["ratio"].append(worker_rate / bare_rate)
            print(
                f"ceiling.{name}.round_{round_} worker {worker_rate:,.0f} ev/s, bare {bare_rate:,.0f} ev/s, "
                f"worker_over_bare {worker_rate / bare_rate:.2f}; CPU us/event: worker client "
                f"{worker.cpu_seconds / n * 1e6:.1f}, server {worker_server / n * 1e6:.1f}; bare client "
                f"{bare['cpu_seconds'] / n * 1e6:.1f}, server {bare_server / n * 1e6:.1f}; "
                f"replay_errors {bare['errors']}, replay_differs {differ} documents; load {_load()}",
                flush=True,
            )
    finally:
        await _drop(recorded_url)
    best_worker, best_bare = max(results["worker"]), max(results["bare"])
    # The sizing model's constants (docs/operations.md), from this run: the worker's
    # client CPU (best round) and what it sent per event.
    constants = {
        "cpu_us_per_event": min(results["cpu"]),
        "store_operations_per_event": (recording.read_statements + recording.write_statements) / n,
        "store_commands_per_event": recording.commands / n,
        "store_bytes_per_event": (recording.read_bytes + recording.write_bytes) / n,
    }
    for key, value in constants.items():
        print(f"ceiling.{name}.model.{key} {value:.3f}")
    for line in model(constants, None):
        print(f"ceiling.{name}.model{line}")
    server_us = min(results["server"])
    if server_us == server_us:  # not NaN: the server runs on this machine
        print(f"ceiling.{name}.model  this server (FerretDB + PostgreSQL) at {CORE_SHARE:.0%} of a core: "
              f"{CORE_SHARE * 1e6 / server_us:,.0f} events/s per core ({server_us:.1f} us/event)")  # fmt: skip
    goal = GOALS.get(name)
    print(f"ceiling.{name}.worker_events_per_s {best_worker:.0f} (best of {rounds})")
    print(f"ceiling.{name}.bare_events_per_s {best_bare:.0f} (best of {rounds})")
    print(f"ceiling.{name}.worker_over_bare {min(results['ratio']):.2f}-{max(results['ratio']):.2f} (per round)")
    if goal:
        verdict = ("the store is the ceiling: the bare replay is below the goal" if best_bare < goal
                   else "the bare replay reaches the goal" if best_worker < goal else "the worker reaches the goal")  # fmt: skip
        print(f"ceiling.{name}.goal {goal} ev/s: {verdict}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mongo", default=os.environ.get("STEPSTREAM_TEST_MONGO_URL"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smaller corpora, one round")
    parser.add_argument("--corpus", action="append", choices=sorted(GOALS), help="only these corpora")
    parser.add_argument("--prefill", type=float, default=0.0,
                        help="first give every database this many times the corpus's runs (other runs, same "
                             "companies): a store that holds data already")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.mongo:
        print("ceiling: skipped (no --mongo / STEPSTREAM_TEST_MONGO_URL)", file=sys.stderr)
        return 0
    rounds = 1 if args.quick else args.rounds
    print(f"ceiling: load {_load()} at the start, {os.cpu_count()} cores shared with the server", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-") as tmp:
        prefills = corpora(args.quick, seed=2, scale=args.prefill) if args.prefill else {}
        for name, events in corpora(args.quick).items():
            if args.corpus and name not in args.corpus:
                continue
            asyncio.run(corpus_run(args.mongo, name, events, rounds, Path(tmp), prefills.get(name, [])))
    print(f"ceiling: load {_load()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
