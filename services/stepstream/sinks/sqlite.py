"""``sqlite:///path.db``: the embedded default; writes in a child process
(``sinks.sqlite_writer``), reads via aiosqlite.

The path follows the SQLAlchemy convention: ``sqlite:///stepstream.db`` is
relative to the working directory, ``sqlite:////var/lib/stepstream.db`` is
absolute. The step store and the deep store may share one file (each creates
only its own tables) or use two.

Three modules, one way: this one (the stores, their reader connection, the
reads) -> ``sinks.sqlite_writer`` (the writer connection's child process, only a
transport) -> ``sinks.sqlite_operations`` (the schema, the parameter rows and the
transactions the child runs, :data:`~stepstream.sinks.sqlite_operations.OPERATIONS`;
its docstring has the tables and the SQL merge). This module imports the schema
bits it reads with (columns, key chunks, error classes) from there too.

**Writes** are one ``BEGIN IMMEDIATE`` transaction per ``write`` call on a
dedicated writer connection, which lives in a child process: one message per
transaction, so building and binding rows never competes with the worker's
folding for the GIL. A step batch's stale-run check runs inside that
transaction, so the check and the write are one atomic step for every writer of
the file. **Reads** use a second connection in this process (aiosqlite) and,
under WAL, see only committed batches.

PRAGMAs: ``journal_mode=WAL``, ``synchronous=FULL`` by default (the WAL is
synced at every commit, so a batch that returned survives a power cut;
``?synchronous=normal`` syncs only at checkpoints: a committed batch survives a
process kill, a power cut may lose the last batches, never corrupt), and a busy
timeout (``?busy_timeout_ms=``, default 30000) so several processes can share
the file. ``durability`` reads the setting back from the connection.

**Errors** (``sqlite_operations.is_retriable``): busy, locked, I/O error, cannot
open and disk full are :class:`SinkUnavailable` (retriable); any other SQLite error
is a :class:`SinkError`, and so is a value SQLite cannot hold (named by table and
exception type, never by value).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import ConfigError, SinkError
from stepstream.sinks.ports import (
    NO_FILTER,
    PROBLEM_COUNTERS,
    PROBLEM_STATUSES,
    Capabilities,
    DeepRun,
    RunFilter,
    RunsPage,
)
from stepstream.sinks.retention import Clock, IndexEntry, merge_index, now_text, prune_via_marks
from stepstream.sinks.sqlite_operations import (
    DEEP_COLS,
    DEEP_JSON_NAMES,
    RUN_COLS,
    RUN_JSON,
    SQL_TYPES,
    STEP_COLS,
    key_chunks,
    sqlite_error,
)
from stepstream.sinks.sqlite_writer import WriterProcess
from stepstream.sinks.semantics import (
    ClipHook,
    RunKey,
    check_keep,
    check_limit,
    decode_cursor,
    page,
)

try:
    import aiosqlite
except ImportError as exc:  # pragma: no cover - a core dependency
    raise ConfigError("the sqlite sink needs aiosqlite: pip install stepstream") from exc

CAPABILITIES = Capabilities(atomic_batch=True, shared_storage=True, monotonic_states=True)
BUSY_TIMEOUT_MS = 30_000
SYNCHRONOUS = "FULL"

_state_decoder = msgspec.json.Decoder(RunState)


class _Database:
    """A writer connection in a child process (``sinks.sqlite_writer``), running each
    transaction whole, and an aiosqlite reader connection in this process."""

    def __init__(self, path: str, synchronous: str, busy_timeout_ms: int) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL") or busy_timeout_ms < 0:
            raise ConfigError(f"sqlite sink: synchronous must be FULL or NORMAL (got {synchronous!r}), "
                              f"busy_timeout_ms at least 0 (got {busy_timeout_ms})")  # fmt: skip
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout_ms = int(busy_timeout_ms)
        self.durability = ""
        self._writer: WriterProcess | None = None
        self.reader: aiosqlite.Connection | None = None
        self.write_lock = asyncio.Lock()

    async def open(self, schema: str) -> None:
        """Open the file; ``schema`` names the tables to make: ``steps`` or ``deep``."""
        # The writer process opens the file first: one that cannot be opened is the
        # SinkError it reports, before aiosqlite starts a reader thread.
        writer = WriterProcess(self.path, self.synchronous, self.busy_timeout_ms, schema)
        await writer.start()
        self._writer = writer
        self.durability = writer.durability
        try:
            self.reader = await self._connect()
        except sqlite3.Error as exc:
            await self.close()
            raise sqlite_error(exc, f"open {self.path}") from exc
        except BaseException:
            await self.close()
            raise

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None, cached_statements=64)
        try:
            await conn.execute_fetchall(f"PRAGMA busy_timeout={self.busy_timeout_ms}")
            await conn.execute_fetchall(f"PRAGMA synchronous={self.synchronous}")
        except BaseException:
            await conn.close()
            raise
        return conn

    async def transaction(self, op: str, *args: Any) -> Any:
        """Run operation ``op`` of :data:`OPERATIONS` (one transaction) in the writer
        process. Raises only :class:`SinkError` (or what cancels the task; the
        transaction then still ends in the writer before the next one starts)."""
        writer = self._writer
        if writer is None:
            raise SinkError("sqlite sink: store is closed")
        async with self.write_lock:
            return await writer.call(op, *args)

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Any]:
        conn = self.reader
        if conn is None:
            raise SinkError("sqlite sink: store is closed")
        try:
            return list(await conn.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise sqlite_error(exc, "read") from exc

    async def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            await reader.close()
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.close()


def _range(after: int | None, limit: int | None) -> tuple[int, int]:
    """``(after, limit)`` parameters of a range select: -1 is "from the first" and "no limit"."""
    return (-1 if after is None else after, -1 if limit is None else check_limit(limit))


# A range of a run's rows (``step_seq > ?``, ``LIMIT ?``; -1 and -1 for all) on the primary key.
_SELECT_STEPS = (
    f"SELECT {', '.join(STEP_COLS)} FROM run_steps WHERE company_id = ? AND run_id = ? AND step_seq > ? "
    "ORDER BY step_seq LIMIT ?"
)
_SELECT_RUN = f"SELECT {', '.join(RUN_COLS)} FROM runs"
_RUN_BOOLS = tuple(f.name for f in msgspec.structs.fields(RunRecord) if f.type is bool)


def _filter_sql(where: RunFilter) -> tuple[list[str], list[object]]:
    """``where`` as SQL conditions on the runs table and their parameters (ports.RunFilter)."""
    clauses: list[str] = []
    params: list[object] = []
    for column, value in (("status", where.status), ("agent_name", where.agent)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if where.since is not None:
        clauses.append("recency >= ?")
        params.append(where.since)
    if where.until is not None:
        clauses.append("recency < ?")
        params.append(where.until)
    if where.problems:
        bad = [f"{name} > 0" for name in PROBLEM_COUNTERS] + ["truncated <> 0"]
        bad.append(f"status IN ({', '.join('?' for _ in PROBLEM_STATUSES)})")
        clauses.append(f"({' OR '.join(bad)})")
        params.extend(PROBLEM_STATUSES)
    return clauses, params


def _decode_state(text: str) -> RunState:
    try:
        return _state_decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise SinkError(f"sqlite sink: a stored run state is not valid: {exc}") from None


def _step(row: Sequence[Any]) -> StepRecord:
    values = dict(zip(STEP_COLS, row, strict=True))
    if values["arguments"] is not None:
        values["arguments"] = msgspec.json.decode(values["arguments"])
    return StepRecord(**values)


def _run(row: Sequence[Any]) -> RunRecord:
    values = dict(zip(RUN_COLS, row, strict=True))
    for name in _RUN_BOOLS:
        values[name] = bool(values[name])
    for i in RUN_JSON:
        name = RUN_COLS[i]
        if values[name] is not None:
            values[name] = msgspec.json.decode(values[name])
    return msgspec.convert(values, RunRecord)


def _deep(row: Sequence[Any]) -> DeepRecord:
    values = dict(zip(DEEP_COLS, row, strict=True))
    values["clipped"] = bool(values["clipped"])
    for name in DEEP_JSON_NAMES:
        if values[name] is not None:
            values[name] = msgspec.json.decode(values[name])
    return DeepRecord(**values)


class SqliteStepStore:
    """Steps, runs and states in one SQLite file; one transaction per write."""

    capabilities = CAPABILITIES

    def __init__(self, path: str, *, synchronous: str = SYNCHRONOUS, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self._db = _Database(path, synchronous, busy_timeout_ms)

    @property
    def durability(self) -> str:
        """``synchronous=FULL`` or ``synchronous=NORMAL``, as the connection reports it."""
        return self._db.durability

    async def open(self) -> SqliteStepStore:
        await self._db.open("steps")
        await self._add_missing_columns()
        return self

    async def _add_missing_columns(self) -> None:
        """A file made before a RunRecord field existed gets its column (nullable)."""
        have = {row[1] for row in await self._db.fetch("PRAGMA table_info(runs)", ())}
        missing = [c for c in RUN_COLS if c not in have]
        if missing:
            types = {f.name: SQL_TYPES.get(f.type, "TEXT") for f in msgspec.structs.fields(RunRecord)}
            statements = "".join(f"ALTER TABLE runs ADD COLUMN {c} {types[c]};\n" for c in missing)
            await self._db.transaction("script", f"BEGIN IMMEDIATE;\n{statements}COMMIT;")

    async def write(
        self,
        steps: Sequence[StepRecord],
        runs: Sequence[RunRecord] = (),
        states: Sequence[RunState] = (),
    ) -> list[RunKey]:
        if not (steps or runs or states):
            return []
        return await self._db.transaction("write_steps", steps, runs, states)

    async def load_states(self, company_id: str, run_ids: Sequence[str]) -> dict[str, RunState]:
        found: dict[str, RunState] = {}
        for size, params in key_chunks([(run_id,) for run_id in dict.fromkeys(run_ids)]):
            rows = await self._db.fetch(
                f"SELECT run_id, state FROM run_state WHERE company_id = ? AND run_id IN ({', '.join('?' * size)})",
                (company_id, *params),
            )
            for run_id, state in rows:
                found[run_id] = _decode_state(state)
        return found

    async def get_run(self, company_id: str, run_id: str) -> RunRecord | None:
        rows = await self._db.fetch(f"{_SELECT_RUN} WHERE company_id = ? AND run_id = ?", (company_id, run_id))
        return _run(rows[0]) if rows else None

    async def list_runs(self, company_id: str, *, limit: int = 50, before: str | None = None) -> list[RunRecord]:
        return (await self.list_runs_page(company_id, limit=limit, before=before)).runs

    async def list_runs_page(
        self, company_id: str, *, limit: int = 50, before: str | None = None, where: RunFilter = NO_FILTER
    ) -> RunsPage:
        check_limit(limit)
        clauses, params = _filter_sql(where)
        if before is not None:
            clauses.append("(recency, run_id) < (?, ?)")
            params.extend(decode_cursor(before))
        sql = " AND ".join(["company_id = ?", *clauses])
        rows = await self._db.fetch(
            f"{_SELECT_RUN} WHERE {sql} ORDER BY recency DESC, run_id DESC LIMIT ?", (company_id, *params, limit + 1)
        )
        return RunsPage(*page([_run(r) for r in rows], limit))

    async def get_steps(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[StepRecord]:
        rows = await self._db.fetch(_SELECT_STEPS, (company_id, run_id, *_range(after, limit)))
        return [_step(r) for r in rows]

    async def list_companies(self) -> list[str]:
        return [c for (c,) in await self._db.fetch("SELECT DISTINCT company_id FROM runs ORDER BY company_id", ())]

    async def mark_deep_pruned(self, company_id: str, run_ids: Sequence[str], at: str) -> int:
        if not run_ids:
            return 0
        return await self._db.transaction("mark_deep_pruned", company_id, list(dict.fromkeys(run_ids)), at)

    async def delete_runs(self, company_id: str, run_ids: Sequence[str]) -> int:
        if not run_ids:
            return 0
        return await self._db.transaction("delete_runs", company_id, list(dict.fromkeys(run_ids)))

    async def close(self) -> None:
        await self._db.close()


class SqliteDeepStore:
    """Deep rows in ``run_step_details``; clipped at the port, one transaction per write."""

    capabilities = CAPABILITIES

    def __init__(
        self,
        path: str,
        limits: Limits | None = None,
        *,
        synchronous: str = SYNCHRONOUS,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        clock: Clock = time.time,
    ) -> None:
        self._db = _Database(path, synchronous, busy_timeout_ms)
        self._limits = limits
        self.on_clip: ClipHook | None = None  # set by open_deep_store; counts clips at the port
        self._clock = clock

    @property
    def durability(self) -> str:
        """``synchronous=FULL`` or ``synchronous=NORMAL``, as the connection reports it."""
        return self._db.durability

    async def open(self) -> SqliteDeepStore:
        await self._db.open("deep")
        await self._add_missing_columns()
        return self

    async def _add_missing_columns(self) -> None:
        """A file made before a DeepRecord field existed (the envelopes) gets its column (nullable)."""
        have = {row[1] for row in await self._db.fetch("PRAGMA table_info(run_step_details)", ())}
        missing = [c for c in DEEP_COLS if c not in have]
        if missing:
            statements = "".join(f"ALTER TABLE run_step_details ADD COLUMN {c} TEXT;\n" for c in missing)
            await self._db.transaction("script", f"BEGIN IMMEDIATE;\n{statements}COMMIT;")

    async def write(self, deeps: Sequence[DeepRecord]) -> None:
        if not deeps:
            return
        # Clipped in the writer process too (``_write_deep``); the fields it cut come back.
        cut = await self._db.transaction("write_deep", list(deeps), now_text(self._clock), self._limits)
        if self.on_clip is not None:
            for field in cut:
                self.on_clip(field)

    async def get_deep(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[DeepRecord]:
        rows = await self._db.fetch(_SELECT_LIVE_DEEP, (company_id, run_id, *_range(after, limit)))
        return [_deep(r) for r in rows]

    async def list_deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        rows = await self._db.fetch(_LIST_DEEP_RUNS, (company_id,))
        return [(run_id, ts) for run_id, ts in rows]

    async def list_companies(self) -> list[str]:
        rows = await self._db.fetch(
            "SELECT company_id FROM deep_runs UNION SELECT company_id FROM run_step_details ORDER BY 1", ()
        )
        return [c for (c,) in rows]

    async def retention_index(self, company_id: str) -> list[DeepRun]:
        # One statement: one snapshot of the index and the bodies.
        rows = await self._db.fetch(_RETENTION_INDEX, (company_id,))
        entries: dict[str, IndexEntry] = {}
        bodies: dict[str, tuple[int, str]] = {}
        for run_id, rank, last_ts, received_at, version, pruned_at, count, last in rows:
            if count is None:
                entries[run_id] = IndexEntry(company_id=company_id, run_id=run_id, rank=rank, last_ts=last_ts,
                                             received_at=received_at, version=version, pruned_at=pruned_at)  # fmt: skip
            else:
                bodies[run_id] = (count, last)
        return merge_index(entries, bodies)

    async def mark_pruned(self, company_id: str, runs: Sequence[tuple[str, int]], at: str) -> list[str]:
        if not runs:
            return []
        return await self._db.transaction("mark_pruned", company_id, [tuple(r) for r in runs], at)

    async def delete_pruned(self, company_id: str, run_ids: Sequence[str]) -> int:
        if not run_ids:
            return 0
        return await self._db.transaction("delete_pruned", company_id, list(dict.fromkeys(run_ids)))

    async def purge_run(self, company_id: str, run_id: str) -> int:
        return await self._db.transaction("purge_run", company_id, run_id)

    async def purge_company(self, company_id: str) -> int:
        return await self._db.transaction("purge_company", company_id)

    async def prune(self, company_id: str, keep: int) -> list[str]:
        check_keep(keep)
        return await prune_via_marks(self, company_id, keep, now_text(self._clock))

    async def close(self) -> None:
        await self._db.close()


_NOT_PRUNED = (
    "NOT EXISTS (SELECT 1 FROM deep_runs AS p WHERE p.company_id = ?1 AND p.run_id = ?2 AND p.pruned_at IS NOT NULL)"
)
_SELECT_LIVE_DEEP = (
    f"SELECT {', '.join(DEEP_COLS)} FROM run_step_details WHERE company_id = ?1 AND run_id = ?2 "
    f"AND step_seq > ?3 AND {_NOT_PRUNED} ORDER BY step_seq LIMIT ?4"
)
_LIST_DEEP_RUNS = (
    "SELECT run_id, max(ts) AS last FROM run_step_details WHERE company_id = ?1 AND run_id NOT IN "
    "(SELECT run_id FROM deep_runs WHERE company_id = ?1 AND pruned_at IS NOT NULL) "
    "GROUP BY run_id ORDER BY last DESC, run_id DESC"
)
_RETENTION_INDEX = (
    "SELECT run_id, rank, last_ts, received_at, version, pruned_at, NULL, NULL FROM deep_runs WHERE company_id = ?1 "
    "UNION ALL SELECT run_id, NULL, NULL, NULL, NULL, NULL, count(*), max(ts) FROM run_step_details "
    "WHERE company_id = ?1 GROUP BY run_id"
)
def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///`` URL (SQLAlchemy convention)."""
    path = url[len("sqlite:///") :].split("?", 1)[0]
    if not path or path == ":memory:":
        raise ConfigError(
            f"sqlite sink needs a file path, e.g. sqlite:///stepstream.db (got {url!r}); "
            "use memory:// for a throwaway store"
        )
    return path

