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
in Go for anything else (the compound indexes exist but its planner does not use
them), so an upsert filtered on the key fields would cost a full scan each.
Run-wide reads (``get_steps``, ``list_runs``, purges) filter on the key fields,
which MongoDB serves from the indexes and FerretDB-on-SQLite by a scan.

**Reads per batch.** The rows a batch needs to see (stored states, reasoning,
index entries) are read in one ``{company_id, _id: {$in: ids}}`` query per
collection and company (at most :data:`READ_QUERIES_MAX` per collection, companies
grouped past that; the deep rows one query per run while a batch has at most that
many runs, and only those below their run's high-water, below), all at once, never
one request per key: FerretDB pushes the
``company_id`` (``run_id``) equality down to PostgreSQL (never ``$in``), so it
decodes one company's (run's) documents instead of the whole collection's. Even
FerretDB's pushed-down ``{_id: value}`` is a scan of the table inside SQLite (its
SQL says ``->'$._id'``, its ``_id`` index is on ``->"_id"``, so SQLite does not use
it), and its ``$in`` is one scan in Go that costs about five of those: against
FerretDB up to :data:`FERRETDB_LOOKUPS_MAX` ids are looked up one by one, more in one
``$in``.

Documents hold the record's fields, with three choices: ``run_steps.arguments``,
``runs.environment`` and the deep bodies ``arguments`` and ``output`` are JSON
*text*, and ``run_state.state`` is the whole RunState as JSON text,
because free-form keys (``$ref``, ``a.b``, ``tool:call.1``) are not safe BSON
field names everywhere and integers beyond int64 are not BSON at all.

**Writes.** A batch's writes to one row are coalesced, in order, into one
``UpdateOne({_id}, {$set: fields}, upsert)`` (later non-None fields win, which is
what applying them one by one does); run records are the batch's writes per
run merged in order (``merge_run``), every field ``$set`` (``None`` as null)
except a ``None`` ``deep_pruned_at`` or ``environment``, so the compactor's mark
survives the worker's writes and the environment its run_start wrote stays. Each
collection gets unordered ``bulk_write`` s (one operation per ``_id``, so their
order does not matter) and the states go last (no multi-document transactions
without a replica set, and none at all in FerretDB 1.x).

A row the batch's read found absent is *inserted* instead (one unordered
``insert_many`` per collection, the document its update would create): on
FerretDB an insert is cheap while every update scans the table (above). Such
rows are: the steps, run record and state of a run with no stored state, the
steps at or past its stored state's ``next_ordinal``, the deep rows at or past
their run's high-water (``deep_runs.next_step``, the ordinal after every one a deep
write of the run has sent, raised before the bodies land; those are not even read)
and the deep rows and index entries the deep write's read did not find. A row whose ``_id`` turns out
taken (another writer created it since the read; the unique ``_id`` refuses the
insert atomically on both servers) gets its update, so the outcome is the
update's in every case.

**Stale runs.** A step batch first reads the stored state of each run it carries
a state for (one query; ``last_seq`` is a field of its own, and an older
document without it is read from its ``state`` text) and drops the runs whose
stored ``last_seq`` is not below the batch's (``semantics.admit``). Then each
state the read found is written conditionally, ``ReplaceOne({_id, last_seq:
{$not: {$gte: new}}}, upsert)``: a stored state at or past ``new`` makes the
upsert collide on ``_id`` (``DuplicateKeyError``), which counts as refused
(tried twice, as two first inserts of one run also collide) and the run is
returned as skipped. A state the read did not find is inserted, and written
conditionally as above if its ``_id`` is taken by then. On
MongoDB that update is atomic per document, so the state itself never goes
backwards; the steps and run record of a run whose stale writer passed the read
just before the new owner wrote can still land (see ``docs/sinks.md``). FerretDB
1.24 evaluates the filter on a read outside the transaction that writes, so two
writers updating one run's state at the same instant can both pass it
(``capabilities.monotonic_states`` is false there).

**Text with U+0000.** A raw string holding U+0000 (reasoning, a label, a failure
message) is stored as its UTF-8 bytes and read back as text: FerretDB on PostgreSQL
refuses ``\\u0000`` (``jsonb``), MongoDB would not care.

**Reads of the write path** (stored states, reasoning, retention entries, the
compactor's ranking) go to the primary whatever the URL's ``readPreference``; the
readers' queries follow the URL. Writes are retryable (``retryWrites=true`` unless the
URL says otherwise).

**Durability.** Unless the URL sets ``w`` or ``journal`` (pymongo's names), every
write uses the write concern ``w=majority, j=true, wtimeout=10000``: acknowledged once a
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
of the rows the batch writes (one query, which also tells which rows exist) and
``$set`` s the text ``core.merge.apply_reasoning`` makes of it (the one
definition of the rule).

**That write is conditional on what was read**, because a run can have two
writers: a former partition owner's late batch and the new owner's. Every write
of a row's text also sets ``reasoning_version`` to a fresh ``ObjectId``, and the
update of a stored row matches only ``{_id, reasoning_version: <read>}`` (for a
row without one, the read text itself: ``reasoning: <read or null>``), without
upsert, one ``update_one`` per row (a bulk says how many matched, not which). A
write that matched nothing is read again, merged again and retried (up to
:data:`REASONING_ATTEMPTS` rounds, then :class:`SinkUnavailable`); so is a row
whose insert found the ``_id`` taken. Unconditional, the late rewrite of chunk 0
erased the newer chunk 1 and chunk 2 was then appended after the hole. Chunks
that change nothing (a replay) write the other fields alone and keep the version.
A row the read again finds gone was purged since: its write is dropped, as if the
purge came just after it, so a purge from another process is never undone. On
MongoDB the condition is atomic per document; FerretDB 1.24 evaluates it on a
read outside the transaction that writes (``capabilities.atomic_reasoning`` is
false there): a write that comes after another still sees it, two at the same
instant can both pass.

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
the entries of its runs (one query, beside the reasoning read; bodies of a run
marked pruned are dropped), then ``$max``/``$inc`` s them (inserts the absent
ones), then writes the bodies. ``mark_pruned`` is a
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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import msgspec

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import ConfigError, SinkError, SinkUnavailable, StepstreamError
from stepstream.sinks.ports import (
    NO_FILTER,
    PROBLEM_COUNTERS,
    PROBLEM_STATUSES,
    Capabilities,
    DeepRun,
    RunFilter,
    RunsPage,
)
from stepstream.sinks.retention import Clock, IndexEntry, batch_ranks, merge_index, now_text, prune_via_marks
from stepstream.sinks.semantics import (
    KEPT_RUN_FIELDS,
    ClipHook,
    RunKey,
    admit,
    apply_reasoning,
    check_keep,
    check_limit,
    clip_batch,
    decode_cursor,
    merge_run,
    newest_first,
    page,
    recency,
    state_keys,
    unstorable,
)

try:
    import pymongo
    from bson import ObjectId
    from pymongo import AsyncMongoClient, ReplaceOne, UpdateOne
    from pymongo.errors import BulkWriteError, ConnectionFailure, DuplicateKeyError, OperationFailure, PyMongoError
    from pymongo.write_concern import WriteConcern
except ImportError as exc:
    raise ConfigError("the mongodb sink needs pymongo: pip install 'stepstream[mongodb]'") from exc

CAPABILITIES = Capabilities(atomic_batch=False, shared_storage=True, monotonic_states=True)
FERRETDB_CAPABILITIES = Capabilities(
    atomic_batch=False, shared_storage=True, monotonic_states=False, atomic_reasoning=False
)
DEFAULT_DATABASE = "stepstream"
DEFAULT_WRITE_CONCERN = {"w": "majority", "j": True}
# A majority that cannot be reached within this is a SinkUnavailable (WTimeoutError),
# retried by the worker, instead of a write that waits forever (the server's default).
DEFAULT_WTIMEOUT_MS = 10_000
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
FERRETDB_LOOKUPS_MAX = 4
# The deep rows a batch may rewrite (below their run's high-water, see MongoDeepStore.write)
# are few: up to this many are looked up one by one by _id (indexed on PostgreSQL), not
# with a $in that FerretDB answers by decoding every stored body of the company.
FERRETDB_DEEP_LOOKUPS_MAX = 64
# The write path's reads of one collection per batch: one query per company (or run), at
# most this many queries (more runs: per company; more companies share queries, grouped).
READ_QUERIES_MAX = 16
Scope = tuple[str, ...]  # (company_id,) or (company_id, run_id): what a read names


def _scope_groups(scopes: list[Scope]) -> list[list[Scope]]:
    """``scopes`` in at most :data:`READ_QUERIES_MAX` groups, one scope each while they
    fit (a query's scope is then equalities, which FerretDB pushes down)."""
    count = min(len(scopes), READ_QUERIES_MAX)
    return [scopes[i::count] for i in range(count)]


def _scope_filter(scope: Scope) -> dict[str, str]:
    """``{company_id[, run_id]}`` of a read's scope."""
    return dict(zip(("company_id", "run_id"), scope, strict=False))


async def _gather(*calls: Awaitable[Any]) -> list[Any]:
    """``asyncio.gather``, except that a failure first cancels and awaits the other
    calls, so no request of a failed batch is still running when it is retried."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Connection:
    """One client and its database, shared by the collections of one store."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: Any = None
        self.db: Any = None
        self.primary: Any = None
        self.ferretdb = False
        self.durability = ""
        self._bulk_lock = asyncio.Lock()

    async def open(self, indexes: dict[str, list[tuple[list[tuple[str, int]], dict[str, Any]]]]) -> None:
        async with _translated("open"):
            query = self.url.partition("?")[2]
            if any(part.split("=", 1)[0].lower() == "j" for part in query.split("&")):
                raise ConfigError("mongodb sink URL: pymongo ignores 'j'; use journal=true or journal=false")
            options = {part.split("=", 1)[0].lower() for part in query.split("&")}
            try:
                # Retryable writes (pymongo's default, said here): a write interrupted by a
                # failover is retried once by the driver, and the server applies it once.
                self.client = AsyncMongoClient(self.url, **({} if "retrywrites" in options else {"retryWrites": True}))
            except pymongo.errors.ConfigurationError as exc:
                raise ConfigError(f"bad mongodb URL: {exc}") from exc
            given = self.client.write_concern.document
            concern = None
            if not {"w", "j", "fsync"} & given.keys():
                concern = WriteConcern(**DEFAULT_WRITE_CONCERN, wtimeout=given.get("wtimeout", DEFAULT_WTIMEOUT_MS))
            self.db = self.client.get_default_database(default=DEFAULT_DATABASE, write_concern=concern)
            # What the write path reads (stored states, reasoning, retention entries) and
            # the compactor's ranking come from the primary whatever the URL's
            # readPreference: a secondary's older copy would pass a stale run or merge
            # text onto an old version. Readers' queries (runs, steps, bodies) follow the URL.
            self.primary = self.db.with_options(read_preference=pymongo.ReadPreference.PRIMARY)
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
        self.client = self.db = self.primary = None

    async def find_by_id(
        self, collection: str, keys: Sequence[tuple[Scope, str]], projection: dict[str, Any], lookups: int = 0
    ) -> dict[str, dict[str, Any]]:
        """The documents of ``collection`` with these ``(scope, _id)`` s, keyed by
        ``_id`` (absent ones are missing). A scope is ``(company_id,)`` or
        ``(company_id, run_id)``: one ``{company_id[, run_id], _id: {$in: ids}}`` query
        per scope, at most :data:`READ_QUERIES_MAX` of them at once (past that many
        runs, one query per company; past that many companies, each query names a
        group of them, ``company_id: {$in: [...]}``). FerretDB pushes only an
        equality of a top-level field down to its backend (``$in`` and ``$or`` it
        evaluates itself, over every document the backend returns, decoding each):
        with ``company_id`` (and ``run_id``) equal, PostgreSQL hands it that
        company's (run's) documents, not the whole collection; on a sharded MongoDB
        the filter also names the shard key's prefix. Against FerretDB, up to
        :data:`FERRETDB_LOOKUPS_MAX` ids are looked up one by one instead: its SQLite
        backend filters a lone ``{_id: value}`` in SQL (a scan of the table in SQLite)
        but evaluates ``$in`` itself over every document of the collection, which costs
        about as much as five such lookups and then no more for more ids."""
        by_scope: dict[Scope, dict[str, None]] = {}
        for scope, _id in keys:
            by_scope.setdefault(scope, {})[_id] = None
        if not by_scope:
            return {}
        if len(by_scope) > READ_QUERIES_MAX and any(len(scope) > 1 for scope in by_scope):
            by_company: dict[Scope, dict[str, None]] = {}
            for scope, ids in by_scope.items():
                by_company.setdefault(scope[:1], {}).update(ids)
            by_scope = by_company
        found = self.on_primary(collection)
        projection = {**projection, "_id": 1}
        if self.ferretdb and sum(map(len, by_scope.values())) <= max(lookups, FERRETDB_LOOKUPS_MAX):
            docs = await _gather(
                *(found.find_one({**_scope_filter(scope), "_id": _id}, projection)
                  for scope, ids in by_scope.items() for _id in ids)
            )  # fmt: skip
        else:
            queries = []
            for group in _scope_groups(list(by_scope)):
                ids = [_id for scope in group for _id in by_scope[scope]]
                where = _scope_filter(group[0]) if len(group) == 1 else {"company_id": {"$in": [g[0] for g in group]}}
                queries.append(found.find({**where, "_id": {"$in": ids}}, projection).to_list())
            docs = [doc for part in await _gather(*queries) for doc in part]
        return {doc["_id"]: doc for doc in docs if doc is not None}

    async def insert_new(self, collection: str, docs: list[dict[str, Any]]) -> list[int]:
        """One unordered ``insert_many``; returns the indexes of the documents whose
        ``_id`` was taken (those are not written), every other error is raised. Both
        servers enforce the unique ``_id`` atomically; FerretDB inserts a command's
        documents in one SQLite transaction (one by one when one collides) and, unlike
        an update, never scans the collection to do it."""
        if not docs:
            return []
        try:
            if self.ferretdb:
                async with self._bulk_lock:
                    await self[collection].insert_many(docs, ordered=False)
            else:
                await self[collection].insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            return _collided(exc)
        return []

    async def upsert(self, collection: str, writes: list[tuple[dict[str, Any] | None, Any]]) -> None:
        """Each ``(document, update)`` writes one ``_id`` (no two the same): a row the
        caller's read found absent comes with the ``document`` its ``update`` would
        create and is inserted (cheap on FerretDB); the others, and every row whose
        insert found the ``_id`` taken meanwhile, get their ``update``. The outcome is
        that of applying the updates alone."""
        fresh = [(doc, op) for doc, op in writes if doc is not None]
        taken = await self.insert_new(collection, [doc for doc, _ in fresh])
        await self.bulk(collection, [op for doc, op in writes if doc is None] + [fresh[i][1] for i in taken])

    async def bulk(self, collection: str, ops: list[Any]) -> None:
        """One unordered ``bulk_write`` (the callers' operations each write a
        different ``_id``, so their order does not matter); against FerretDB, in
        commands of at most :data:`FERRETDB_UPDATES_PER_COMMAND` statements, one
        command at a time.

        FerretDB 1.24 keeps the SQLite cursor of every matching update statement
        open until the whole ``update`` command ends (``defer`` in a loop,
        ``handler/msg_update.go``), and its pool has 100 connections per database:
        a command of about 100 updates to existing documents, or several such
        commands at once, deadlock the whole server."""
        if not ops:
            return
        if not self.ferretdb:
            await self[collection].bulk_write(ops, ordered=False)
            return
        async with self._bulk_lock:
            for start in range(0, len(ops), FERRETDB_UPDATES_PER_COMMAND):
                await self[collection].bulk_write(ops[start : start + FERRETDB_UPDATES_PER_COMMAND], ordered=False)

    async def update_each(self, collection: str, updates: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[int]:
        """``update_one(where, update)`` (no upsert) for each; returns the indexes of
        those that matched no document. A bulk reports how many matched, not which
        (and a retry of a whole bulk would write again the rows whose write landed),
        so each is a command of its own: all at once on MongoDB, one at a time on
        FerretDB (see :meth:`bulk`)."""
        found = self[collection]
        if self.ferretdb:
            results = []
            async with self._bulk_lock:
                for where, update in updates:
                    results.append(await found.update_one(where, update))
        else:
            results = await _gather(*(found.update_one(where, update) for where, update in updates))
        return [index for index, result in enumerate(results) if result.matched_count == 0]

    async def replace_unless_ahead(self, collection: str, writes: list[tuple[str, int, dict[str, Any]]]) -> list[int]:
        """``ReplaceOne({_id, last_seq: {$not: {$gte: seq}}}, doc, upsert)`` for each
        ``(_id, seq, doc)``; returns the indexes refused (a stored ``last_seq`` at or
        past ``seq`` makes the upsert collide on ``_id``). MongoDB: one unordered
        bulk. FerretDB answers a bulk whose statement failed without ``nModified``
        (pymongo then raises ``KeyError``): there a failed command's documents are read
        back and those that do not hold what was written are sent one per command."""
        replaces = [({"_id": _id, "last_seq": {"$not": {"$gte": seq}}}, doc) for _id, seq, doc in writes]
        if not self.ferretdb:
            try:
                await self[collection].bulk_write(
                    [ReplaceOne(where, doc, upsert=True) for where, doc in replaces], ordered=False
                )
            except BulkWriteError as exc:
                return _collided(exc)
            return []
        # FerretDB: commands of up to FERRETDB_UPDATES_PER_COMMAND; one whose statement
        # collided is answered without nModified (pymongo: KeyError), so which of its
        # statements landed is read back (a document holding exactly what was written)
        # and the others are sent one per command.
        refused = []
        found = self[collection]
        async with self._bulk_lock:
            for start in range(0, len(replaces), FERRETDB_UPDATES_PER_COMMAND):
                chunk = list(enumerate(replaces))[start : start + FERRETDB_UPDATES_PER_COMMAND]
                try:
                    await found.bulk_write([ReplaceOne(where, doc, upsert=True) for _, (where, doc) in chunk], ordered=False)
                    continue
                except (KeyError, BulkWriteError):
                    pass
                ids = [where["_id"] for _, (where, _) in chunk]
                stored = {d["_id"]: d async for d in self.on_primary(collection).find({"_id": {"$in": ids}})}
                for index, (where, doc) in chunk:
                    if stored.get(where["_id"]) == {"_id": where["_id"], **doc}:
                        continue  # this statement landed
                    try:
                        await found.replace_one(where, doc, upsert=True)
                    except DuplicateKeyError:
                        refused.append(index)
        return refused

    def on_primary(self, collection: str) -> Any:
        """``collection`` read from the primary (the write path's and compactor's reads)."""
        self[collection]  # the closed-store check
        return self.primary[collection]

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


def _stored_text(text: str) -> str | bytes:
    """A string as stored: one holding U+0000 as its UTF-8 bytes (BSON binary),
    because PostgreSQL's ``jsonb`` refuses ``\\u0000`` (FerretDB on PostgreSQL
    answers ``unsupported Unicode escape sequence``); MongoDB would take it either way."""
    return text.encode() if "\x00" in text else text


def _storable(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` (and the documents inside it) with every string :func:`_stored_text`
    (in place). JSON-text fields escape U+0000 already; this is for the raw ones."""
    for name, value in fields.items():
        if type(value) is str:
            if "\x00" in value:
                fields[name] = value.encode()
        elif type(value) is dict:
            _storable(value)
    return fields


def _read_back(doc: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`_storable` (in place): no field of ours holds bytes otherwise."""
    for name, value in doc.items():
        if type(value) is bytes:
            doc[name] = value.decode()
        elif type(value) is dict:
            _read_back(value)
    return doc


def _text(value: str | bytes | None) -> str | None:
    return value.decode() if type(value) is bytes else value  # type: ignore[union-attr]


def _collided(exc: BulkWriteError) -> list[int]:
    """The indexes of an unordered bulk's operations that collided on ``_id``; the
    error itself again when anything else failed (another error, a write concern)."""
    details = exc.details
    errors = details.get("writeErrors", [])
    if details.get("writeConcernErrors") or any(e.get("code") != DUPLICATE_KEY for e in errors):
        raise exc
    return sorted(e["index"] for e in errors)


def row_id(company_id: str, run_id: str, step_seq: int | None = None) -> str:
    """The ``_id`` of a row: the JSON array of its key, e.g. ``["acme","r1",3]``
    (injective for any strings, so no two tenants' keys can collide)."""
    key = (company_id, run_id) if step_seq is None else (company_id, run_id, step_seq)
    return _json.encode(key).decode()


def _run_write(run: RunRecord, new: bool) -> tuple[dict[str, Any] | None, Any]:
    """The run record's ``(document, update)`` for :meth:`_Connection.upsert` (the
    document only when the caller believes the record ``new``)."""
    # Every field is set (None as null), except the compactor's deep_pruned_at and the
    # environment (written once, with its run_start), which a write of None leaves as
    # stored (core.merge.merge_run): the record replaces whole but for those.
    doc = _to_builtins(msgspec.structs.asdict(run))
    for name in KEPT_RUN_FIELDS:
        if doc[name] is None:
            del doc[name]
    if run.environment is not None:  # free-form keys: JSON text, as step arguments
        doc["environment"] = _json.encode(run.environment).decode()
    doc["recency"] = recency(run)
    _storable(doc)
    _id = row_id(run.company_id, run.run_id)
    return ({"_id": _id, **doc} if new else None), UpdateOne({"_id": _id}, {"$set": doc}, upsert=True)


def _step_writes(
    steps: Sequence[StepRecord], is_new: Callable[[StepKey], bool]
) -> list[tuple[dict[str, Any] | None, Any]]:
    """One ``$set`` per row: the batch's writes to a row coalesced in order (later
    non-None fields win), which is exactly what applying them one by one does; with
    the document that ``$set`` creates for the rows ``is_new`` names."""
    merged: dict[StepKey, dict[str, Any]] = {}
    for step in steps:
        fields = _to_builtins(step)  # omit_defaults: the None fields (which keep) are absent
        if step.arguments is not None:
            fields["arguments"] = _json.encode(step.arguments).decode()
        _storable(fields)
        merged.setdefault((step.company_id, step.run_id, step.step_seq), {}).update(fields)
    writes = []
    for key, fields in merged.items():
        _id = row_id(*key)
        update = UpdateOne({"_id": _id}, {"$set": fields}, upsert=True)
        writes.append(({"_id": _id, **fields} if is_new(key) else None, update))
    return writes


def _merged_per_run(runs: Sequence[RunRecord]) -> dict[tuple[str, str], RunRecord]:
    """A batch's run records, one per run: what applying them in order leaves."""
    merged: dict[tuple[str, str], RunRecord] = {}
    for run in runs:
        key = (run.company_id, run.run_id)
        merged[key] = merge_run(merged.get(key), run)
    return merged


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


# A deep row's reasoning carries the token of the write that made it (a fresh
# ObjectId per write), so a conditional write compares a few bytes, not the text.
REASONING_VERSION = "reasoning_version"
REASONING_ATTEMPTS = 5


class _Seen(NamedTuple):
    """What a read found of a deep row's reasoning: the text (``None``: none) and
    the version token (``None``: a row with no text, or written before tokens)."""

    reasoning: str | None
    version: Any


def _reasoning_filter(_id: str, seen: _Seen) -> dict[str, Any]:
    """Matches the row only while it holds what was ``seen``: the same token, or for
    a row without one the same text (``None`` matches a missing field too)."""
    where = {"_id": _id, REASONING_VERSION: seen.version}
    if seen.version is None:
        where["reasoning"] = None if seen.reasoning is None else _stored_text(seen.reasoning)
    return where


class _RowWrite:
    """A batch's writes to one deep row, coalesced in order: the fields it sets (later
    non-None values won), its latest ``ts``, and its reasoning chunks
    ``(offset, text)`` in order, merged onto whatever text the write finds."""

    __slots__ = ("chunks", "fields", "ts")

    def __init__(self, fields: dict[str, Any], ts: str) -> None:
        self.fields = fields
        self.ts = ts
        self.chunks: list[tuple[int, str]] = []

    def text_over(self, stored: str | None) -> str | None:
        """The text after this batch's chunks land on ``stored`` (``apply_reasoning``)."""
        for offset, chunk in self.chunks:
            stored = apply_reasoning(stored, offset, chunk)
        return stored

    def update(self, fields: dict[str, Any] | None = None) -> dict[str, Any]:
        """The update of a stored row: ``fields`` (default: the batch's, no text)
        ``$set``, ``ts`` the latest, ``clipped`` false if new."""
        fields = self.fields if fields is None else fields
        update: dict[str, Any] = {"$set": fields, "$max": {"ts": self.ts}}
        if "clipped" not in fields:
            update["$setOnInsert"] = {"clipped": False}
        return update

    def write_over(self, _id: str, seen: _Seen) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(filter, update)`` of a stored row whose reasoning was ``seen``: the merged
        text and a new version, on condition that the row still holds what was seen;
        where the chunks change nothing (a replay), the other fields alone, and the
        stored text keeps its version (so a writer that read it too still matches)."""
        text = self.text_over(seen.reasoning)
        if text == seen.reasoning:
            return {"_id": _id}, self.update()
        fields = {**self.fields, "reasoning": _stored_text(text), REASONING_VERSION: ObjectId()}  # type: ignore[arg-type]
        return _reasoning_filter(_id, seen), self.update(fields)

    def document(self, _id: str) -> dict[str, Any]:
        """The document its update creates where no row is stored."""
        fields = self.fields
        if self.chunks:
            fields = {**fields, "reasoning": _stored_text(self.text_over(None)), REASONING_VERSION: ObjectId()}  # type: ignore[arg-type]
        return {"_id": _id, **fields, "ts": self.ts, "clipped": fields.get("clipped", False)}


class _Stored(msgspec.Struct):
    """What a step batch needs of a stored state: ``last_seq`` (the stale-run rule)
    and ``next_ordinal`` (the steps at or past it are not stored yet)."""

    last_seq: int = -1
    next_ordinal: int = 0


_stored_decoder = msgspec.json.Decoder(_Stored)


def _stored(doc: dict[str, Any]) -> _Stored:
    """A stored state's ``last_seq`` (its own field, or for documents written before
    the field existed the one inside the state text) and ``next_ordinal``."""
    stored = _stored_decoder.decode(doc["state"])
    if "last_seq" in doc:
        stored.last_seq = int(doc["last_seq"])
    return stored


def _step(doc: dict[str, Any]) -> StepRecord:
    _read_back(doc)
    arguments = doc.pop("arguments", None)
    step = msgspec.convert(doc, StepRecord)
    if arguments is not None:
        step.arguments = msgspec.json.decode(arguments)
    return step


def _filter_query(where: RunFilter) -> dict[str, Any]:
    """``where`` as a query on the runs collection (ports.RunFilter)."""
    query: dict[str, Any] = {}
    if where.status is not None:
        query["status"] = where.status
    if where.agent is not None:
        query["agent_name"] = where.agent
    window = {**({"$gte": where.since} if where.since is not None else {}),
              **({"$lt": where.until} if where.until is not None else {})}  # fmt: skip
    if window:
        query["recency"] = window
    if where.problems:
        bad: list[dict[str, Any]] = [{name: {"$gt": 0}} for name in PROBLEM_COUNTERS]
        bad += [{"truncated": True}, {"status": {"$in": list(PROBLEM_STATUSES)}}]
        query["$and"] = [{"$or": bad}]
    return query


def _run(doc: dict[str, Any]) -> RunRecord:
    _read_back(doc)
    environment = doc.pop("environment", None)
    if environment is not None:
        doc["environment"] = msgspec.json.decode(environment)
    return msgspec.convert(doc, RunRecord)


# Deep fields holding JSON values, stored as JSON text (free-form keys such as "$x" or "a.b").
_DEEP_JSON_NAMES = ("arguments", "output", "call_event", "result_event")


def _deep(doc: dict[str, Any]) -> DeepRecord:
    doc.pop(REASONING_VERSION, None)
    if type(doc.get("reasoning")) is bytes:
        doc["reasoning"] = doc["reasoning"].decode()
    bodies = {name: doc.pop(name) for name in _DEEP_JSON_NAMES if doc.get(name) is not None}
    deep = msgspec.convert(doc, DeepRecord)
    for name, text in bodies.items():
        setattr(deep, name, msgspec.json.decode(text))
    return deep


def _range_query(company_id: str, run_id: str, after: int | None) -> dict[str, Any]:
    """A run's rows with ``step_seq > after`` (all when ``None``), on the run's index."""
    query: dict[str, Any] = {"company_id": company_id, "run_id": run_id}
    if after is not None:
        query["step_seq"] = {"$gt": after}
    return query


def _limit(limit: int | None) -> int:
    return 0 if limit is None else check_limit(limit)  # 0: no limit (the driver's spelling)


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
        batch = admit(steps, runs, states, {key: seen.last_seq for key, seen in stored.items()})
        # Rows of a run with no stored state, and steps at or past its stored
        # next_ordinal, were not written yet (or by a write whose state did not land):
        # they are inserted, and updated only if their _id turns out taken.
        with_state = {(s.company_id, s.run_id) for s in batch.states}

        def is_new(key: StepKey) -> bool:
            run = key[:2]
            return run in with_state and (run not in stored or key[2] >= stored[run].next_ordinal)

        if batch.steps:
            async with _translated("write run_steps"):
                await self._conn.upsert("run_steps", _step_writes(batch.steps, is_new))
        if batch.runs:
            records = _merged_per_run(batch.runs)
            async with _translated("write runs"):
                await self._conn.upsert(
                    "runs", [_run_write(r, key in with_state and key not in stored) for key, r in records.items()]
                )
        refused: list[RunKey] = []
        if batch.states:
            async with _translated("write run_state"):
                refused = await self._write_states(list(_last_per_run(batch.states).values()), stored)
        return batch.skipped + refused

    async def _stored_last_seq(self, keys: Sequence[RunKey]) -> dict[RunKey, _Stored]:
        """The stored ``last_seq`` and ``next_ordinal`` of those runs that have a
        state (one query, see :meth:`_Connection.find_by_id`)."""
        if not keys:
            return {}
        ids = {row_id(*key): key for key in keys}
        docs = await self._conn.find_by_id(
            "run_state", [(key[:1], _id) for _id, key in ids.items()], {"last_seq": 1, "state": 1}
        )
        return {ids[_id]: _stored(doc) for _id, doc in docs.items()}

    async def _write_states(self, states: list[RunState], stored: dict[RunKey, _Stored]) -> list[RunKey]:
        """Each state only if it is ahead of the stored one; returns the runs refused,
        in ``states`` order. A run the read found without a state is inserted (the
        unique ``_id`` refuses it if another writer created it since); the others,
        and those, are replaced conditionally. A refusal of the conditional write is
        retried once: two first writes of one run collide on ``_id`` whatever their
        ``last_seq``, and the second try then compares them."""
        order = {(s.company_id, s.run_id): i for i, s in enumerate(states)}
        fresh = [s for s in states if (s.company_id, s.run_id) not in stored]
        fresh_docs = [{"_id": _id, **doc} for _id, _, doc in map(_state_write, fresh)]
        taken = await self._conn.insert_new("run_state", fresh_docs)
        pending = [s for s in states if (s.company_id, s.run_id) in stored] + [fresh[i] for i in taken]
        for _ in range(2):
            if not pending:
                break
            refused = await self._conn.replace_unless_ahead("run_state", [_state_write(s) for s in pending])
            pending = [pending[i] for i in refused]
        return sorted(((s.company_id, s.run_id) for s in pending), key=order.__getitem__)

    async def load_states(self, company_id: str, run_ids: Sequence[str]) -> dict[str, RunState]:
        if not run_ids:
            return {}
        async with _translated("load_states"):
            docs = await self._conn.find_by_id(
                "run_state", [((company_id,), row_id(company_id, r)) for r in run_ids], {"run_id": 1, "state": 1}
            )
        return {doc["run_id"]: _state_decoder.decode(doc["state"]) for doc in docs.values()}

    async def get_run(self, company_id: str, run_id: str) -> RunRecord | None:
        async with _translated("get_run"):
            doc = await self._conn["runs"].find_one({"_id": row_id(company_id, run_id)}, _NO_ID)
        return _run(doc) if doc is not None else None

    async def list_runs(self, company_id: str, *, limit: int = 50, before: str | None = None) -> list[RunRecord]:
        return (await self.list_runs_page(company_id, limit=limit, before=before)).runs

    async def list_runs_page(
        self, company_id: str, *, limit: int = 50, before: str | None = None, where: RunFilter = NO_FILTER
    ) -> RunsPage:
        check_limit(limit)
        query: dict[str, Any] = {"company_id": company_id, **_filter_query(where)}
        if before is not None:
            after_recency, after_run = decode_cursor(before)
            query.setdefault("$and", []).append(
                {"$or": [{"recency": {"$lt": after_recency}}, {"recency": after_recency, "run_id": {"$lt": after_run}}]}
            )
        async with _translated("list_runs"):
            cursor = self._conn["runs"].find(query, _NO_ID).sort([("recency", -1), ("run_id", -1)]).limit(limit + 1)
            runs = [_run(doc) async for doc in cursor]
        return RunsPage(*page(runs, limit))

    async def get_steps(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[StepRecord]:
        most = _limit(limit)  # a bad limit is the caller's error, before the driver is involved
        async with _translated("get_steps"):
            query = _range_query(company_id, run_id, after)
            cursor = self._conn["run_steps"].find(query, _NO_ID).sort("step_seq", 1).limit(most)
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
    for the conditional write of positional reasoning."""

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
            entries = await self._index_entries(list(dict.fromkeys((d.company_id, d.run_id) for d in deeps)))
            # Only rows that can exist are read: those of runs with an entry, below its
            # high-water (next_step: past every ordinal a deep write of the run has sent;
            # an entry without one, older or the compactor's, says nothing). A row this
            # misses is safe: its insert collides on _id and its update (or the
            # reasoning's read, merge and conditional write) follows, as for a row
            # another writer created since the read.
            candidates = []
            for d in deeps:
                entry = entries.get((d.company_id, d.run_id))
                if entry is not None and (entry[1] is None or d.step_seq < entry[1]):
                    candidates.append((d.company_id, d.run_id, d.step_seq))
            stored = await self._stored_reasoning(candidates) if candidates else {}
            entries = {key: pruned_at for key, (pruned_at, _) in entries.items()}
            pruned = {key for key, pruned_at in entries.items() if pruned_at}
            if pruned:
                deeps = [d for d in deeps if (d.company_id, d.run_id) not in pruned]
                if not deeps:
                    return
            # The index moves before the bodies land, so a prune that ranked the run
            # before this write misses it.
            index_writes = []
            next_step: dict[RunKey, int] = {}
            for d in deeps:
                key2 = (d.company_id, d.run_id)
                next_step[key2] = max(next_step.get(key2, 0), d.step_seq + 1)
            for (c, r), (last, rank) in batch_ranks(deeps, received).items():
                _id = row_id(c, r)
                high = next_step[(c, r)]
                fresh = {"_id": _id, "company_id": c, "run_id": r, "rank": rank, "last_ts": last,
                         "received_at": received, "version": 1, "next_step": high}  # fmt: skip
                update = UpdateOne(
                    {"_id": _id},
                    {"$max": {"rank": rank, "last_ts": last, "received_at": received, "next_step": high},
                     "$inc": {"version": 1},
                     "$setOnInsert": {"company_id": c, "run_id": r}},
                    upsert=True,
                )  # fmt: skip
                index_writes.append((fresh if (c, r) not in entries else None, update))
            await self._conn.upsert("deep_runs", index_writes)
            # The batch's writes to a row coalesce into one $set, applied in order:
            # later non-None fields win, clipped is sticky, and the reasoning chunks are
            # merged onto the stored text (below, conditionally).
            rows: dict[StepKey, _RowWrite] = {}
            for d in deeps:
                key = (d.company_id, d.run_id, d.step_seq)
                row = rows.get(key)
                if row is None:
                    row = rows[key] = _RowWrite(
                        {"company_id": d.company_id, "run_id": d.run_id, "step_seq": d.step_seq}, d.ts
                    )
                fields = row.fields
                fields["kind"] = d.kind
                row.ts = max(row.ts, d.ts)
                if d.reasoning is not None:
                    row.chunks.append((d.reasoning_offset, d.reasoning))
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
            fresh = [key for key in rows if key not in stored]  # absent at the read: inserted
            taken = await self._conn.insert_new("run_step_details", [rows[key].document(row_id(*key)) for key in fresh])
            # The rows stored, and those another writer created since the read, get
            # their update: a field-by-field $set, and where the batch writes text,
            # one conditional on the text it was merged onto (_write_reasoning).
            updated = [key for key in rows if key in stored] + [fresh[i] for i in taken]
            await self._conn.bulk(
                "run_step_details",
                [UpdateOne({"_id": row_id(*key)}, rows[key].update(), upsert=True)
                 for key in updated if not rows[key].chunks],
            )  # fmt: skip
            texts = {key: rows[key] for key in updated if rows[key].chunks}
            if texts:
                await self._write_reasoning(texts, {key: stored[key] for key in texts if key in stored})

    async def _write_reasoning(self, rows: dict[StepKey, _RowWrite], seen: dict[StepKey, _Seen]) -> None:
        """Each row's update, its text merged from the text ``seen`` and written only
        if the row still holds that text (its ``reasoning_version`` token, or the text
        itself for a row without one; :meth:`_RowWrite.write_over`: chunks that change
        nothing, as a replay's, write the other fields alone, unconditionally), one
        ``update_one`` per row. A row whose write matched nothing (another writer
        changed it since the read) is read again and its chunks merged onto the newer
        text; a row ``seen`` lacks (its insert found the ``_id`` taken) is read first.
        A row the read finds gone was purged since the batch read it: its write is
        dropped, as if the purge came just after it. Gives up, retriable, after
        :data:`REASONING_ATTEMPTS` rounds that all missed."""
        unread = [key for key in rows if key not in seen]
        pending = [key for key in rows if key in seen]
        for _ in range(REASONING_ATTEMPTS):
            if unread:
                found = await self._stored_reasoning(unread)
                seen.update(found)
                pending += [key for key in unread if key in found]
            if not pending:
                return
            missed = await self._conn.update_each(
                "run_step_details",
                [rows[key].write_over(row_id(*key), seen[key]) for key in pending],
            )
            unread, pending = [pending[i] for i in missed], []
        if unread:
            raise SinkUnavailable(
                f"mongodb sink: write run_step_details: the text of {len(unread)} row(s) kept changing "
                f"under the write ({REASONING_ATTEMPTS} conditional writes missed)"
            )

    async def _stored_reasoning(self, keys: Sequence[StepKey]) -> dict[StepKey, _Seen]:
        """The rows among ``keys`` that exist, with their stored reasoning (``None``
        when they hold none) and its version token: one query per run while the keys
        name at most :data:`READ_QUERIES_MAX` runs, else per company
        (:meth:`_Connection.find_by_id`). The deep rows are the large documents, and
        FerretDB decodes every one its backend returns for the filter: a run's rows
        are what it needs, a company's are all of its stored bodies."""
        ids = {row_id(*key): key for key in keys}
        if not ids:
            return {}
        docs = await self._conn.find_by_id(
            "run_step_details", [(key[:2], _id) for _id, key in ids.items()], {"reasoning": 1, REASONING_VERSION: 1},
            lookups=FERRETDB_DEEP_LOOKUPS_MAX,
        )
        return {ids[_id]: _Seen(_text(doc.get("reasoning")), doc.get(REASONING_VERSION)) for _id, doc in docs.items()}

    async def _index_entries(self, keys: Sequence[RunKey]) -> dict[RunKey, str | None]:
        """The runs among ``keys`` that have a retention index entry, with its
        ``pruned_at`` (one query)."""
        if not keys:
            return {}
        ids = {row_id(*key): key for key in keys}
        docs = await self._conn.find_by_id("deep_runs", [(key[:1], _id) for _id, key in ids.items()], {"pruned_at": 1, "next_step": 1})
        return {ids[_id]: (doc.get("pruned_at"), doc.get("next_step")) for _id, doc in docs.items()}

    async def _pruned(self, keys: Sequence[RunKey]) -> set[RunKey]:
        """Those runs whose index entry is marked pruned."""
        return {key for key, (pruned_at, _) in (await self._index_entries(keys)).items() if pruned_at}

    async def get_deep(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[DeepRecord]:
        most = _limit(limit)
        async with _translated("get_deep"):
            if await self._pruned([(company_id, run_id)]):
                return []
            query = _range_query(company_id, run_id, after)
            cursor = self._conn["run_step_details"].find(query, _NO_ID).sort("step_seq", 1).limit(most)
            return [_deep(doc) async for doc in cursor]

    async def list_deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        async with _translated("list_deep_runs"):
            pruned = {r for r, e in (await self._entries(company_id)).items() if e.pruned_at is not None}
            return [(r, ts) for r, ts in await self._deep_runs(company_id) if r not in pruned]

    async def _entries(self, company_id: str) -> dict[str, IndexEntry]:
        entries = {}
        async for doc in self._conn.on_primary("deep_runs").find({"company_id": company_id}, _NO_ID):
            entries[doc["run_id"]] = IndexEntry(
                company_id=company_id, run_id=doc["run_id"], rank=doc.get("rank", ""), last_ts=doc.get("last_ts", ""),
                received_at=doc.get("received_at", ""), version=int(doc.get("version", 0)),
                pruned_at=doc.get("pruned_at"),
            )  # fmt: skip
        return entries

    async def _bodies(self, company_id: str) -> dict[str, tuple[int, str]]:
        bodies: dict[str, tuple[int, str]] = {}
        cursor = self._conn.on_primary("run_step_details").find({"company_id": company_id}, {"_id": 0, "run_id": 1, "ts": 1})
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
