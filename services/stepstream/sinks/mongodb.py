"""``mongodb://host:port/db``: MongoDB or a MongoDB-wire server (FerretDB), via
pymongo's async client. An optional extra: ``pip install 'stepstream[mongodb]'``.

The database is the URL's path (default ``stepstream``); other URL options are
pymongo's. Collections and indexes (created at open, idempotently)::

    run_steps         _id ["company","run",seq]; unique (company_id, run_id, step_seq)
    run_step_details  _id ["company","run",seq]; unique (company_id, run_id, step_seq);
                      recency (company_id, run_id, ts)
    runs              _id ["company","run"]; unique (company_id, run_id);
                      recency (company_id, recency desc, run_id desc)
    run_state         _id ["company","run"]; unique (company_id, run_id)

Every document's ``_id`` is the JSON text of its key (injective, so two tenants'
keys never collide) and every point write or read goes by ``_id``: FerretDB 1.x
on SQLite pushes down *only* an ``{_id: value}`` filter and scans the collection
for anything else (the compound indexes exist but its planner does not use
them), so an upsert filtered on the key fields would cost a full scan each.
Run-wide reads (``get_steps``, ``list_runs``, purges) filter on the key fields,
which MongoDB serves from the indexes and FerretDB-on-SQLite by a scan.

Documents hold the record's fields, with three choices: ``run_steps.arguments``,
``runs.environment`` and the deep bodies ``arguments`` and ``output`` are JSON *text*, and ``run_state.state`` is the whole RunState as JSON text,
because free-form keys (``$ref``, ``a.b``, ``tool:call.1``) are not safe BSON
field names everywhere and integers beyond int64 are not BSON at all.

**Writes.** A batch's writes to one row are coalesced, in order, into one
``UpdateOne({_id}, {$set: fields}, upsert)`` (later non-None fields win, which is
what applying them one by one does); run records are the batch's last write
per run, every field ``$set`` (``None`` as null) except a ``None``
``deep_pruned_at``, so the compactor's mark survives the worker's writes. Each collection gets ordered ``bulk_write`` s and the
states go last (no multi-document transactions without a replica set, and none
at all in FerretDB 1.x).

**Stale runs.** A step batch first reads the stored state of each run it carries
a state for (by ``_id``; ``last_seq`` is a field of its own, and an older
document without it is read from its ``state`` text) and drops the runs whose
stored ``last_seq`` is not below the batch's (``semantics.admit``). Then each
state is written conditionally, ``ReplaceOne({_id, last_seq: {$not: {$gte:
new}}}, upsert)``: a stored state at or past ``new`` makes the upsert collide
on ``_id`` (``DuplicateKeyError``), which counts as refused (tried twice, as two
first inserts of one run also collide) and the run is returned as skipped. On
MongoDB that update is atomic per document, so the state itself never goes
backwards; the steps and run record of a run whose stale writer passed the read
just before the new owner wrote can still land (see ``docs/sinks.md``). FerretDB
1.24 evaluates the filter on a read outside the transaction that writes, so two
writers updating one run's state at the same instant can both pass it
(``capabilities.monotonic_states`` is false there).

**Durability.** Unless the URL sets ``w`` or ``journal`` (pymongo's names), every
write uses the write concern ``w=majority, j=true``: acknowledged once a
majority of the replica set has it in its journal (on a standalone server, once
it is in the journal). ``durability`` names the effective concern. FerretDB 1.24
accepts and ignores write concerns (``writeConcern`` is an ignored field of its
commands); its durability is that of its own SQLite backend.

**Errors.** Lost connections, timeouts (network, server selection, ``maxTimeMS``,
a write concern's ``wtimeout``), a primary stepping down or shutting down, and
errors labelled ``RetryableWriteError`` are :class:`SinkUnavailable`; other
server errors are :class:`SinkError`, and so is a document BSON cannot hold (an
integer beyond 64 bits, a lone surrogate, an invalid document), whose message
names the collection and the exception type but never the value.

A deep row's ``clipped`` is sticky (``$set`` only when true, ``$setOnInsert``
false otherwise) and its ``ts`` the latest (``$max``). The positional reasoning
merge needs ``stored[:offset] + written + stored[offset + len(written):]``;
MongoDB could do it with an update pipeline (``$substrCP``/``$concat``) but
FerretDB 1.x rejects pipeline updates, so the adapter reads the stored reasoning
of every row the batch writes reasoning to (one ``_id`` lookup each) and
``$set`` s the text ``core.merge.apply_reasoning`` makes of it (the one
definition of the rule).
That is a read-modify-write: correct because one run is written by one worker at
a time (Kafka partitioning) and this store serialises its own deep writes. A row
whose stored text was merged is then updated without upsert, and no text is
cached between batches, so a purge from another process that lands between the
read and the write is never undone (that row's write is dropped, as if the purge
came just after it).

**FerretDB 1.24 deadlock.** Its update handler keeps the SQLite cursor of every
matching statement open until the whole ``update`` command ends, and its pool
holds 100 connections per database: a ``bulk_write`` of ~100 updates to existing
documents (or several such commands at once) hangs the whole server. Against
FerretDB (detected by ``buildInfo.ferretdbVersion``) the adapter sends at most
16 statements per command, one command at a time per store.

**Retention.** FerretDB 1.x implements only ``$count``/``$sum`` accumulators in
``$group``, so ``list_deep_runs`` reads ``(run_id, ts)`` through the covering
recency index and takes the maximum per run here. The retention index is the
collection ``deep_runs`` (``_id`` ["company","run"]): a deep write first reads
the entries of its runs by ``_id`` (bodies of a run marked pruned are dropped),
then ``$max``/``$inc`` s them, then writes the bodies. ``mark_pruned`` is a
conditional ``update_one({_id, version, pruned_at: null})`` per run (atomic per
document on MongoDB), then ``delete_pruned`` deletes. Without transactions a
crash between the two leaves a marked run with bodies that no reader sees
(``get_deep`` checks the mark) and that the next pass deletes; a write whose
check read the entry just before the mark can land bodies after it, with the
same outcome. FerretDB 1.24 evaluates the filter outside the transaction that
writes, so a write racing the mark can lose its version bump: the run is then
pruned whole although it was written during the pass (never torn).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import ConfigError, SinkError, SinkUnavailable, StepstreamError
from stepstream.sinks.ports import Capabilities, DeepRun, RunsPage
from stepstream.sinks.retention import Clock, IndexEntry, batch_ranks, merge_index, now_text, prune_via_marks
from stepstream.sinks.semantics import (
    ClipHook,
    RunKey,
    admit,
    apply_reasoning,
    check_keep,
    check_limit,
    clip_batch,
    decode_cursor,
    newest_first,
    page,
    recency,
    state_keys,
    unstorable,
)

try:
    import pymongo
    from pymongo import AsyncMongoClient, ReplaceOne, UpdateOne
    from pymongo.errors import BulkWriteError, ConnectionFailure, DuplicateKeyError, OperationFailure, PyMongoError
    from pymongo.write_concern import WriteConcern
except ImportError as exc:
    raise ConfigError("the mongodb sink needs pymongo: pip install 'stepstream[mongodb]'") from exc

CAPABILITIES = Capabilities(atomic_batch=False, shared_storage=True, monotonic_states=True)
FERRETDB_CAPABILITIES = Capabilities(atomic_batch=False, shared_storage=True, monotonic_states=False)
DEFAULT_DATABASE = "stepstream"
DEFAULT_WRITE_CONCERN = {"w": "majority", "j": True}
DUPLICATE_KEY = 11000
# Server error codes that mean "not now": host unreachable or not found, network
# timeout, shutting down, primary stepped down, time limit, socket error, write
# concern failed, not (or no longer) primary, interrupted by a state change.
TRANSIENT_CODES = frozenset({6, 7, 64, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436})

_json = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(RunState)
_to_builtins = msgspec.to_builtins
_NO_ID = {"_id": 0}

StepKey = tuple[str, str, int]


def is_transient(exc: PyMongoError) -> bool:
    """Whether the same call may succeed later (see the module doc)."""
    if isinstance(exc, ConnectionFailure) or exc.timeout:
        return True
    if exc.has_error_label("RetryableWriteError"):
        return True
    if isinstance(exc, BulkWriteError):
        errors = exc.details.get("writeConcernErrors", []) + exc.details.get("writeErrors", [])
        return bool(errors) and all(e.get("code") in TRANSIENT_CODES for e in errors)
    return isinstance(exc, OperationFailure) and exc.code in TRANSIENT_CODES


def _describe(exc: PyMongoError) -> str:
    """The error without documents: a server error's details (``str`` appends them
    all) can carry the failed operation whole, and bodies hold secrets, so only
    codes and server messages are kept."""
    if isinstance(exc, BulkWriteError):
        errors = exc.details.get("writeErrors", []) + exc.details.get("writeConcernErrors", [])
        shown = "; ".join(f"code {e.get('code')}: {str(e.get('errmsg', ''))[:200]}" for e in errors[:3])
        return f"{len(errors)} error(s): {shown}"
    if isinstance(exc, OperationFailure):
        return f"code {exc.code}: {str((exc.details or {}).get('errmsg', type(exc).__name__))[:200]}"
    return str(exc)


@asynccontextmanager
async def _translated(what: str) -> AsyncIterator[None]:
    """Every failure as the sink error tree: transient trouble is retriable, a
    value BSON cannot hold (``OverflowError``, ``InvalidDocument``, ...) is not."""
    try:
        yield
    except StepstreamError:
        raise
    except PyMongoError as exc:
        kind = SinkUnavailable if is_transient(exc) else SinkError
        raise kind(f"mongodb sink: {what}: {_describe(exc)}") from None
    except Exception as exc:  # bson's OverflowError, InvalidDocument, UnicodeEncodeError, ...
        raise unstorable("mongodb", what, exc) from None


def _concern_text(document: dict[str, Any]) -> str:
    """A write concern as ``w=majority,j=true[,wtimeout=N]`` (a fixed key order)."""
    keys = sorted(document, key=lambda k: (("w", "j", "wtimeout", "fsync") + (k,)).index(k))
    parts = [f"{k}={str(document[k]).lower() if isinstance(document[k], bool) else document[k]}" for k in keys]
    return ",".join(parts) or "server default"


FERRETDB_UPDATES_PER_COMMAND = 16


class _Connection:
    """One client and its database, shared by the collections of one store."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: Any = None
        self.db: Any = None
        self.ferretdb = False
        self.durability = ""
        self._bulk_lock = asyncio.Lock()

    async def open(self, indexes: dict[str, list[tuple[list[tuple[str, int]], dict[str, Any]]]]) -> None:
        async with _translated("open"):
            query = self.url.partition("?")[2]
            if any(part.split("=", 1)[0].lower() == "j" for part in query.split("&")):
                raise ConfigError("mongodb sink URL: pymongo ignores 'j'; use journal=true or journal=false")
            try:
                self.client = AsyncMongoClient(self.url)
            except pymongo.errors.ConfigurationError as exc:
                raise ConfigError(f"bad mongodb URL: {exc}") from exc
            given = self.client.write_concern.document
            concern = None
            if not {"w", "j", "fsync"} & given.keys():
                concern = WriteConcern(**DEFAULT_WRITE_CONCERN, wtimeout=given.get("wtimeout"))
            self.db = self.client.get_default_database(default=DEFAULT_DATABASE, write_concern=concern)
            build = await self.db.command("buildInfo")
            self.ferretdb = "ferretdbVersion" in build
            self.durability = _concern_text(self.db.write_concern.document)
            if self.ferretdb:
                self.durability += " (ignored by FerretDB)"
            for collection, specs in indexes.items():
                for keys, options in specs:
                    await self.db[collection].create_index(keys, **options)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        self.client = self.db = None

    async def bulk(self, collection: str, ops: list[Any]) -> None:
        """One ordered ``bulk_write``; against FerretDB, in commands of at most
        :data:`FERRETDB_UPDATES_PER_COMMAND` statements, one command at a time.

        FerretDB 1.24 keeps the SQLite cursor of every matching update statement
        open until the whole ``update`` command ends (``defer`` in a loop,
        ``handler/msg_update.go``), and its pool has 100 connections per database:
        a command of about 100 updates to existing documents, or several such
        commands at once, deadlock the whole server."""
        if not self.ferretdb:
            await self[collection].bulk_write(ops, ordered=True)
            return
        async with self._bulk_lock:
            for start in range(0, len(ops), FERRETDB_UPDATES_PER_COMMAND):
                await self[collection].bulk_write(ops[start : start + FERRETDB_UPDATES_PER_COMMAND], ordered=True)

    async def replace_unless_ahead(self, collection: str, writes: list[tuple[str, int, dict[str, Any]]]) -> list[int]:
        """``ReplaceOne({_id, last_seq: {$not: {$gte: seq}}}, doc, upsert)`` for each
        ``(_id, seq, doc)``; returns the indexes refused (a stored ``last_seq`` at or
        past ``seq`` makes the upsert collide on ``_id``). MongoDB: one unordered
        bulk. FerretDB answers a bulk whose statement failed without ``nModified``
        (pymongo then raises ``KeyError``), so there it is one statement per command."""
        replaces = [({"_id": _id, "last_seq": {"$not": {"$gte": seq}}}, doc) for _id, seq, doc in writes]
        if not self.ferretdb:
            try:
                await self[collection].bulk_write(
                    [ReplaceOne(where, doc, upsert=True) for where, doc in replaces], ordered=False
                )
            except BulkWriteError as exc:
                details = exc.details
                errors = details.get("writeErrors", [])
                if details.get("writeConcernErrors") or any(e.get("code") != DUPLICATE_KEY for e in errors):
                    raise
                return sorted(e["index"] for e in errors)
            return []
        refused = []
        async with self._bulk_lock:
            for index, (where, doc) in enumerate(replaces):
                try:
                    await self[collection].replace_one(where, doc, upsert=True)
                except DuplicateKeyError:
                    refused.append(index)
        return refused

    def __getitem__(self, collection: str) -> Any:
        if self.db is None:
            raise SinkError("mongodb sink: store is closed")
        return self.db[collection]


_KEY3 = [("company_id", 1), ("run_id", 1), ("step_seq", 1)]
_KEY2 = [("company_id", 1), ("run_id", 1)]

STEP_INDEXES = {
    "run_steps": [(_KEY3, {"unique": True, "name": "key"})],
    "runs": [
        (_KEY2, {"unique": True, "name": "key"}),
        ([("company_id", 1), ("recency", -1), ("run_id", -1)], {"name": "recency"}),
    ],
    "run_state": [(_KEY2, {"unique": True, "name": "key"})],
}
DEEP_INDEXES = {
    "run_step_details": [
        (_KEY3, {"unique": True, "name": "key"}),
        ([("company_id", 1), ("run_id", 1), ("ts", 1)], {"name": "recency"}),
    ],
    "deep_runs": [(_KEY2, {"unique": True, "name": "key"})],
}


def row_id(company_id: str, run_id: str, step_seq: int | None = None) -> str:
    """The ``_id`` of a row: the JSON array of its key, e.g. ``["acme","r1",3]``
    (injective for any strings, so no two tenants' keys can collide)."""
    key = (company_id, run_id) if step_seq is None else (company_id, run_id, step_seq)
    return _json.encode(key).decode()


def _run_op(run: RunRecord) -> Any:
    # Every field is set (None as null), except the compactor's deep_pruned_at, which a
    # worker's write (None) leaves as stored: the record replaces whole but for the mark.
    doc = _to_builtins(msgspec.structs.asdict(run))
    if doc["deep_pruned_at"] is None:
        del doc["deep_pruned_at"]
    if run.environment is not None:  # free-form keys: JSON text, as step arguments
        doc["environment"] = _json.encode(run.environment).decode()
    doc["recency"] = recency(run)
    return UpdateOne({"_id": row_id(run.company_id, run.run_id)}, {"$set": doc}, upsert=True)


def _step_ops(steps: Sequence[StepRecord]) -> list[Any]:
    """One ``$set`` per row: the batch's writes to a row coalesced in order (later
    non-None fields win), which is exactly what applying them one by one does."""
    merged: dict[StepKey, dict[str, Any]] = {}
    for step in steps:
        fields = _to_builtins(step)  # omit_defaults: the None fields (which keep) are absent
        if step.arguments is not None:
            fields["arguments"] = _json.encode(step.arguments).decode()
        merged.setdefault((step.company_id, step.run_id, step.step_seq), {}).update(fields)
    return [UpdateOne({"_id": row_id(*key)}, {"$set": fields}, upsert=True) for key, fields in merged.items()]


def _last_per_run(records: Sequence[Any]) -> dict[tuple[str, str], Any]:
    """Whole-record writes: the last one per run is all that a batch leaves."""
    return {(r.company_id, r.run_id): r for r in records}


def _state_write(state: RunState) -> tuple[str, int, dict[str, Any]]:
    doc = {
        "company_id": state.company_id,
        "run_id": state.run_id,
        "last_seq": state.last_seq,
        "state": _json.encode(state).decode(),
    }
    return row_id(state.company_id, state.run_id), state.last_seq, doc


def _last_seq(doc: dict[str, Any]) -> int:
    """A stored state's ``last_seq``: its own field, or (documents written before
    the field existed) the one inside the state text."""
    if "last_seq" in doc:
        return int(doc["last_seq"])
    return _state_decoder.decode(doc["state"]).last_seq


def _step(doc: dict[str, Any]) -> StepRecord:
    arguments = doc.pop("arguments", None)
    step = msgspec.convert(doc, StepRecord)
    if arguments is not None:
        step.arguments = msgspec.json.decode(arguments)
    return step


def _run(doc: dict[str, Any]) -> RunRecord:
    environment = doc.pop("environment", None)
    if environment is not None:
        doc["environment"] = msgspec.json.decode(environment)
    return msgspec.convert(doc, RunRecord)


# Deep fields holding JSON values, stored as JSON text (free-form keys such as "$x" or "a.b").
_DEEP_JSON_NAMES = ("arguments", "output", "call_event", "result_event")


def _deep(doc: dict[str, Any]) -> DeepRecord:
    bodies = {name: doc.pop(name) for name in _DEEP_JSON_NAMES if doc.get(name) is not None}
    deep = msgspec.convert(doc, DeepRecord)
    for name, text in bodies.items():
        setattr(deep, name, msgspec.json.decode(text))
    return deep


class MongoStepStore:
    """Steps, runs and states in a MongoDB database; states written last, each only
    if it moves its run forward."""

    capabilities = CAPABILITIES

    def __init__(self, url: str) -> None:
        self._conn = _Connection(url)

    @property
    def durability(self) -> str:
        """The effective write concern, e.g. ``w=majority,j=true``."""
        return self._conn.durability

    async def open(self) -> MongoStepStore:
        try:
            await self._conn.open(STEP_INDEXES)
        except BaseException:
            await self._conn.close()
            raise
        if self._conn.ferretdb:
            self.capabilities = FERRETDB_CAPABILITIES
        return self

    async def write(
        self,
        steps: Sequence[StepRecord],
        runs: Sequence[RunRecord] = (),
        states: Sequence[RunState] = (),
    ) -> list[RunKey]:
        if not (steps or runs or states):
            return []
        async with _translated("read run_state"):
            stored = await self._stored_last_seq(state_keys(states))
        batch = admit(steps, runs, states, stored)
        if batch.steps:
            async with _translated("write run_steps"):
                await self._conn.bulk("run_steps", _step_ops(batch.steps))
        if batch.runs:
            async with _translated("write runs"):
                await self._conn.bulk("runs", [_run_op(r) for r in _last_per_run(batch.runs).values()])
        refused: list[RunKey] = []
        if batch.states:
            async with _translated("write run_state"):
                refused = await self._write_states(list(_last_per_run(batch.states).values()))
        return batch.skipped + refused

    async def _stored_last_seq(self, keys: Sequence[RunKey]) -> dict[RunKey, int]:
        if not keys:
            return {}
        collection = self._conn["run_state"]
        projection = {"_id": 0, "last_seq": 1, "state": 1}
        docs = await asyncio.gather(*(collection.find_one({"_id": row_id(*key)}, projection) for key in keys))
        return {key: _last_seq(doc) for key, doc in zip(keys, docs, strict=True) if doc is not None}

    async def _write_states(self, states: list[RunState]) -> list[RunKey]:
        """Each state only if it is ahead of the stored one; returns the runs refused.
        A refusal is retried once: two first writes of one run collide on ``_id``
        whatever their ``last_seq``, and the second try then compares them."""
        pending = states
        for _ in range(2):
            refused = await self._conn.replace_unless_ahead("run_state", [_state_write(s) for s in pending])
            pending = [pending[i] for i in refused]
            if not pending:
                break
        return [(s.company_id, s.run_id) for s in pending]

    async def load_states(self, company_id: str, run_ids: Sequence[str]) -> dict[str, RunState]:
        if not run_ids:
            return {}
        collection = self._conn["run_state"]
        async with _translated("load_states"):
            # One _id lookup per run: the only filter FerretDB's SQLite backend can push down.
            docs = await asyncio.gather(
                *(collection.find_one({"_id": row_id(company_id, r)}, _NO_ID) for r in dict.fromkeys(run_ids))
            )
            return {doc["run_id"]: _state_decoder.decode(doc["state"]) for doc in docs if doc is not None}

    async def get_run(self, company_id: str, run_id: str) -> RunRecord | None:
        async with _translated("get_run"):
            doc = await self._conn["runs"].find_one({"_id": row_id(company_id, run_id)}, _NO_ID)
        return _run(doc) if doc is not None else None

    async def list_runs(self, company_id: str, *, limit: int = 50, before: str | None = None) -> list[RunRecord]:
        return (await self.list_runs_page(company_id, limit=limit, before=before)).runs

    async def list_runs_page(self, company_id: str, *, limit: int = 50, before: str | None = None) -> RunsPage:
        check_limit(limit)
        query: dict[str, Any] = {"company_id": company_id}
        if before is not None:
            after_recency, after_run = decode_cursor(before)
            query["$or"] = [
                {"recency": {"$lt": after_recency}},
                {"recency": after_recency, "run_id": {"$lt": after_run}},
            ]
        async with _translated("list_runs"):
            cursor = self._conn["runs"].find(query, _NO_ID).sort([("recency", -1), ("run_id", -1)]).limit(limit + 1)
            runs = [_run(doc) async for doc in cursor]
        return RunsPage(*page(runs, limit))

    async def get_steps(self, company_id: str, run_id: str) -> list[StepRecord]:
        async with _translated("get_steps"):
            cursor = (
                self._conn["run_steps"].find({"company_id": company_id, "run_id": run_id}, _NO_ID).sort("step_seq", 1)
            )
            return [_step(doc) async for doc in cursor]

    async def list_companies(self) -> list[str]:
        async with _translated("list_companies"):
            return sorted(await self._conn["runs"].distinct("company_id"))

    async def mark_deep_pruned(self, company_id: str, run_ids: Sequence[str], at: str) -> int:
        changed = 0
        async with _translated("mark_deep_pruned"):
            for run_id in dict.fromkeys(run_ids):
                result = await self._conn["runs"].update_one(
                    {"_id": row_id(company_id, run_id), "deep_pruned_at": None}, {"$set": {"deep_pruned_at": at}}
                )
                changed += result.modified_count
        return changed

    async def delete_runs(self, company_id: str, run_ids: Sequence[str]) -> int:
        gone = 0
        async with _translated("delete_runs"):
            for run_id in dict.fromkeys(run_ids):
                # The run record last: a pass killed midway finds the run again next time.
                await self._conn["run_steps"].delete_many({"company_id": company_id, "run_id": run_id})
                await self._conn["run_state"].delete_one({"_id": row_id(company_id, run_id)})
                result = await self._conn["runs"].delete_one({"_id": row_id(company_id, run_id)})
                gone += result.deleted_count
        return gone

    async def close(self) -> None:
        await self._conn.close()


class MongoDeepStore:
    """Deep rows in ``run_step_details``; clipped at the port; see the module doc
    for the read-modify-write of positional reasoning."""

    capabilities = CAPABILITIES

    def __init__(self, url: str, limits: Limits | None = None, *, clock: Clock = time.time) -> None:
        self._conn = _Connection(url)
        self._limits = limits
        self.on_clip: ClipHook | None = None  # set by open_deep_store; counts clips at the port
        self._clock = clock
        self._write_lock = asyncio.Lock()

    @property
    def durability(self) -> str:
        """The effective write concern, e.g. ``w=majority,j=true``."""
        return self._conn.durability

    async def open(self) -> MongoDeepStore:
        try:
            await self._conn.open(DEEP_INDEXES)
        except BaseException:
            await self._conn.close()
            raise
        if self._conn.ferretdb:
            self.capabilities = FERRETDB_CAPABILITIES
        return self

    async def write(self, deeps: Sequence[DeepRecord]) -> None:
        if not deeps:
            return
        deeps = clip_batch(deeps, self._limits, self.on_clip)
        received = now_text(self._clock)
        async with self._write_lock, _translated("write run_step_details"):
            # The bodies of runs marked pruned are dropped; the index moves before the
            # bodies land, so a prune that ranked the run before this write misses it.
            pruned = await self._pruned(list(dict.fromkeys((d.company_id, d.run_id) for d in deeps)))
            if pruned:
                deeps = [d for d in deeps if (d.company_id, d.run_id) not in pruned]
                if not deeps:
                    return
            index_ops = [
                UpdateOne(
                    {"_id": row_id(c, r)},
                    {"$max": {"rank": rank, "last_ts": last, "received_at": received}, "$inc": {"version": 1},
                     "$setOnInsert": {"company_id": c, "run_id": r}},
                    upsert=True,
                )  # fmt: skip
                for (c, r), (last, rank) in batch_ranks(deeps, received).items()
            ]
            await self._conn.bulk("deep_runs", index_ops)
            stored = await self._stored_reasoning(deeps)
            current = dict(stored)
            # The batch's writes to a row coalesce into one $set, applied in order:
            # later non-None fields win, clipped is sticky, and the reasoning is the
            # positional merge computed here from the stored text.
            merged: dict[StepKey, dict[str, Any]] = {}
            latest: dict[StepKey, str] = {}
            for d in deeps:
                key = (d.company_id, d.run_id, d.step_seq)
                fields = merged.setdefault(
                    key, {"company_id": d.company_id, "run_id": d.run_id, "step_seq": d.step_seq}
                )
                fields["kind"] = d.kind
                latest[key] = max(latest.get(key, d.ts), d.ts)
                if d.reasoning is not None:
                    fields["reasoning"] = current[key] = apply_reasoning(
                        current.get(key), d.reasoning_offset, d.reasoning
                    )
                if d.arguments is not None:
                    fields["arguments"] = _json.encode(d.arguments).decode()
                if d.output is not None:
                    fields["output"] = _json.encode(d.output).decode()
                if d.call_event is not None:
                    fields["call_event"] = _json.encode(d.call_event).decode()
                if d.result_event is not None:
                    fields["result_event"] = _json.encode(d.result_event).decode()
                if d.clipped:
                    fields["clipped"] = True
            ops = []
            for key, fields in merged.items():
                update: dict[str, Any] = {"$set": fields, "$max": {"ts": latest[key]}}
                if "clipped" not in fields:
                    update["$setOnInsert"] = {"clipped": False}
                # A row whose stored text we merged is updated, never re-created: if a
                # purge deleted it since the read, the write must not bring its head back.
                ops.append(UpdateOne({"_id": row_id(*key)}, update, upsert=key not in stored))
            await self._conn.bulk("run_step_details", ops)

    async def _stored_reasoning(self, deeps: Sequence[DeepRecord]) -> dict[StepKey, str | None]:
        """Stored reasoning of the rows this batch writes reasoning to (a chunk at
        any offset keeps the stored text past its span), keyed only for rows that
        exist."""
        wanted = list(dict.fromkeys((d.company_id, d.run_id, d.step_seq) for d in deeps if d.reasoning is not None))
        if not wanted:
            return {}
        collection = self._conn["run_step_details"]
        projection = {"_id": 0, "reasoning": 1}
        # One _id lookup per row (typically one open thinking step per run in a batch):
        # FerretDB's SQLite backend pushes down only an _id equality, $in would scan.
        docs = await asyncio.gather(*(collection.find_one({"_id": row_id(*key)}, projection) for key in wanted))
        return {key: doc.get("reasoning") for key, doc in zip(wanted, docs, strict=True) if doc is not None}

    async def _pruned(self, keys: Sequence[RunKey]) -> set[RunKey]:
        """Those runs whose index entry is marked pruned (one ``_id`` lookup each)."""
        if not keys:
            return set()
        collection = self._conn["deep_runs"]
        docs = await asyncio.gather(
            *(collection.find_one({"_id": row_id(*key)}, {"_id": 0, "pruned_at": 1}) for key in keys)
        )
        return {key for key, doc in zip(keys, docs, strict=True) if doc is not None and doc.get("pruned_at")}

    async def get_deep(self, company_id: str, run_id: str) -> list[DeepRecord]:
        async with _translated("get_deep"):
            if await self._pruned([(company_id, run_id)]):
                return []
            cursor = (
                self._conn["run_step_details"]
                .find({"company_id": company_id, "run_id": run_id}, _NO_ID)
                .sort("step_seq", 1)
            )
            return [_deep(doc) async for doc in cursor]

    async def list_deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        async with _translated("list_deep_runs"):
            pruned = {r for r, e in (await self._entries(company_id)).items() if e.pruned_at is not None}
            return [(r, ts) for r, ts in await self._deep_runs(company_id) if r not in pruned]

    async def _entries(self, company_id: str) -> dict[str, IndexEntry]:
        entries = {}
        async for doc in self._conn["deep_runs"].find({"company_id": company_id}, _NO_ID):
            entries[doc["run_id"]] = IndexEntry(
                company_id=company_id, run_id=doc["run_id"], rank=doc.get("rank", ""), last_ts=doc.get("last_ts", ""),
                received_at=doc.get("received_at", ""), version=int(doc.get("version", 0)),
                pruned_at=doc.get("pruned_at"),
            )  # fmt: skip
        return entries

    async def _bodies(self, company_id: str) -> dict[str, tuple[int, str]]:
        bodies: dict[str, tuple[int, str]] = {}
        cursor = self._conn["run_step_details"].find({"company_id": company_id}, {"_id": 0, "run_id": 1, "ts": 1})
        async for doc in cursor:
            count, last = bodies.get(doc["run_id"], (0, ""))
            bodies[doc["run_id"]] = (count + 1, max(last, doc["ts"]))
        return bodies

    async def list_companies(self) -> list[str]:
        async with _translated("list_companies"):
            found = set(await self._conn["deep_runs"].distinct("company_id"))
            found.update(await self._conn["run_step_details"].distinct("company_id"))
        return sorted(found)

    async def retention_index(self, company_id: str) -> list[DeepRun]:
        async with _translated("retention_index"):
            # Entries first: a write in between bumps the version, which a later mark then sees.
            entries = await self._entries(company_id)
            return merge_index(entries, await self._bodies(company_id))

    async def mark_pruned(self, company_id: str, runs: Sequence[tuple[str, int]], at: str) -> list[str]:
        marked = []
        collection = self._conn["deep_runs"]
        async with _translated("mark_pruned"):
            for run_id, version in runs:
                _id = row_id(company_id, run_id)
                if version == 0:
                    insert = {"company_id": company_id, "run_id": run_id, "rank": "", "last_ts": "",
                              "received_at": "", "version": 0, "pruned_at": at}  # fmt: skip
                    result = await collection.update_one({"_id": _id}, {"$setOnInsert": insert}, upsert=True)
                    done = result.upserted_id is not None
                else:
                    result = await collection.update_one(
                        {"_id": _id, "version": version, "pruned_at": None}, {"$set": {"pruned_at": at}}
                    )
                    done = result.modified_count == 1
                if done:
                    marked.append(run_id)
        return marked

    async def delete_pruned(self, company_id: str, run_ids: Sequence[str]) -> int:
        keys = [(company_id, r) for r in dict.fromkeys(run_ids)]
        gone = 0
        async with _translated("delete_pruned"):
            for key in await self._pruned(keys):
                result = await self._conn["run_step_details"].delete_many({"company_id": key[0], "run_id": key[1]})
                gone += result.deleted_count
        return gone

    async def _deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        last: dict[str, str] = {}
        cursor = self._conn["run_step_details"].find({"company_id": company_id}, {"_id": 0, "run_id": 1, "ts": 1})
        async for doc in cursor:
            run_id, ts = doc["run_id"], doc["ts"]
            if run_id not in last or ts > last[run_id]:
                last[run_id] = ts
        return newest_first(last)

    async def purge_run(self, company_id: str, run_id: str) -> int:
        async with _translated("purge_run"):
            result = await self._conn["run_step_details"].delete_many({"company_id": company_id, "run_id": run_id})
            await self._conn["deep_runs"].delete_one({"_id": row_id(company_id, run_id), "pruned_at": None})
        return result.deleted_count

    async def purge_company(self, company_id: str) -> int:
        async with _translated("purge_company"):
            result = await self._conn["run_step_details"].delete_many({"company_id": company_id})
            await self._conn["deep_runs"].delete_many({"company_id": company_id, "pruned_at": None})
        return result.deleted_count

    async def prune(self, company_id: str, keep: int) -> list[str]:
        check_keep(keep)
        return await prune_via_marks(self, company_id, keep, now_text(self._clock))

    async def close(self) -> None:
        await self._conn.close()
