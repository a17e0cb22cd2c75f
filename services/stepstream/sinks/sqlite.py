"""``sqlite:///path.db``: the embedded default, via aiosqlite.

The path follows the SQLAlchemy convention: ``sqlite:///stepstream.db`` is
relative to the working directory, ``sqlite:////var/lib/stepstream.db`` is
absolute. The step store and the deep store may share one file (each creates
only its own tables) or use two.

Schema (created if missing; columns mirror the record fields)::

    run_steps         PRIMARY KEY (company_id, run_id, step_seq), WITHOUT ROWID;
                      arguments is JSON text
    runs              PRIMARY KEY (company_id, run_id), WITHOUT ROWID, plus
                      recency = coalesce(started_at, last_event_at, '') and the
                      index runs_recency (company_id, recency DESC, run_id DESC)
    run_state         PRIMARY KEY (company_id, run_id), WITHOUT ROWID; state is the
                      msgspec JSON of the RunState
    run_step_details  PRIMARY KEY (company_id, run_id, step_seq) (a rowid table:
                      bodies are large), index run_step_details_recency
                      (company_id, run_id, ts) that also covers list_deep_runs

**Writes** are ``executemany`` upserts with prepared statements, one
``BEGIN IMMEDIATE`` transaction per ``write`` call on a dedicated writer
connection; reads use a second connection and, under WAL, see only committed
batches. The merge is SQL: ``col = coalesce(excluded.col, col)``,
``clipped = max(clipped, excluded.clipped)``, ``ts = max(ts, excluded.ts)``
and, for the positional reasoning,
``stepstream_splice(reasoning, offset, excluded.reasoning)``: a SQL function
registered on the writer connection that returns ``stored[:offset] + written``
in Python. SQLite's own ``substr`` counts characters but stops at a NUL
character (U+0000, legal in JSON text and so in reasoning), which would silently
drop the tail; the function is only called when a chunk lands past character 0
of an existing row. Plain ``sqlite3`` can read the file; only this upsert needs
the function.

PRAGMAs: ``journal_mode=WAL``, ``synchronous=NORMAL`` (a committed batch survives
a process kill; a power cut may lose the last batches, never corrupt), and a
busy timeout so several processes can share the file.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec

from stepstream.core.fold import Limits
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import ConfigError, SinkError, SinkUnavailable
from stepstream.sinks.ports import Capabilities, RunsPage
from stepstream.sinks.semantics import check_keep, check_limit, clip_batch, decode_cursor, page, recency

try:
    import aiosqlite
except ImportError as exc:  # pragma: no cover - a core dependency
    raise ConfigError("the sqlite sink needs aiosqlite: pip install stepstream") from exc

CAPABILITIES = Capabilities(atomic_batch=True, shared_storage=True)
BUSY_TIMEOUT_MS = 30_000

T = TypeVar("T")

_STEP_COLS = StepRecord.__struct_fields__
_RUN_COLS = RunRecord.__struct_fields__
_DEEP_COLS = tuple(f for f in DeepRecord.__struct_fields__ if f != "reasoning_offset")
_STEP_ARGS = _STEP_COLS.index("arguments")
_KEY3 = ("company_id", "run_id", "step_seq")
_KEY2 = ("company_id", "run_id")
_SQL_TYPES = {int: "INTEGER", bool: "INTEGER", str: "TEXT"}


def _columns(record_type: type, names: Sequence[str], overrides: dict[str, str]) -> str:
    fields = {f.name: f for f in msgspec.structs.fields(record_type)}
    out = []
    for name in names:
        if name in overrides:
            out.append(f"{name} {overrides[name]}")
            continue
        kind = _SQL_TYPES.get(fields[name].type, "TEXT")  # optionals and literals are TEXT
        required = fields[name].required or fields[name].default is not None
        out.append(f"{name} {kind}{' NOT NULL' if required else ''}")
    return ",\n  ".join(out)


def step_schema() -> str:
    return f"""
CREATE TABLE IF NOT EXISTS run_steps (
  {_columns(StepRecord, _STEP_COLS, {"arguments": "TEXT"})},
  PRIMARY KEY (company_id, run_id, step_seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS runs (
  {_columns(RunRecord, _RUN_COLS, {})},
  recency TEXT NOT NULL,
  PRIMARY KEY (company_id, run_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS runs_recency ON runs (company_id, recency DESC, run_id DESC);
CREATE TABLE IF NOT EXISTS run_state (
  company_id TEXT NOT NULL,
  run_id TEXT NOT NULL,
  state TEXT NOT NULL,
  PRIMARY KEY (company_id, run_id)
) WITHOUT ROWID;
"""


def deep_schema() -> str:
    return f"""
CREATE TABLE IF NOT EXISTS run_step_details (
  {_columns(DeepRecord, _DEEP_COLS, {"clipped": "INTEGER NOT NULL DEFAULT 0"})},
  PRIMARY KEY (company_id, run_id, step_seq)
);
CREATE INDEX IF NOT EXISTS run_step_details_recency ON run_step_details (company_id, run_id, ts);
"""


def _upsert(table: str, cols: Sequence[str], key: Sequence[str], merge: Callable[[str], str]) -> str:
    updates = ", ".join(f"{c} = {merge(c)}" for c in cols if c not in key)
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )


_UPSERT_STEP = _upsert(
    "run_steps", _STEP_COLS, _KEY3, lambda c: "excluded.kind" if c == "kind" else f"coalesce(excluded.{c}, {c})"
)
_UPSERT_RUN = _upsert("runs", (*_RUN_COLS, "recency"), _KEY2, lambda c: f"excluded.{c}")
_UPSERT_STATE = _upsert("run_state", (*_KEY2, "state"), _KEY2, lambda c: f"excluded.{c}")


def _deep_upsert() -> str:
    # Parameters are the DeepRecord fields in order (msgspec.structs.astuple), so
    # ?N numbers them; reasoning_offset is used only by the positional merge.
    n = {name: i + 1 for i, name in enumerate(DeepRecord.__struct_fields__)}
    values = ", ".join(f"?{n[c]}" for c in _DEEP_COLS)
    off = f"?{n['reasoning_offset']}"
    return (
        f"INSERT INTO run_step_details ({', '.join(_DEEP_COLS)}) VALUES ({values}) "
        "ON CONFLICT (company_id, run_id, step_seq) DO UPDATE SET "
        "kind = excluded.kind, ts = max(ts, excluded.ts), "
        "reasoning = CASE WHEN excluded.reasoning IS NULL THEN reasoning "
        f"WHEN {off} = 0 OR reasoning IS NULL THEN excluded.reasoning "
        f"ELSE stepstream_splice(reasoning, {off}, excluded.reasoning) END, "
        "arguments = coalesce(excluded.arguments, arguments), "
        "output = coalesce(excluded.output, output), "
        "clipped = max(clipped, excluded.clipped)"
    )


_UPSERT_DEEP = _deep_upsert()


def splice(stored: str, offset: int, written: str) -> str:
    """The positional merge as the SQL function ``stepstream_splice``."""
    return stored[:offset] + written


_json = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(RunState)


def step_params(steps: Sequence[StepRecord]) -> list[tuple[Any, ...]]:
    encode, astuple, i = _json.encode, msgspec.structs.astuple, _STEP_ARGS
    out = []
    for step in steps:
        row = astuple(step)
        if row[i] is not None:
            row = (*row[:i], encode(row[i]).decode(), *row[i + 1 :])
        out.append(row)
    return out


def run_params(runs: Sequence[RunRecord]) -> list[tuple[Any, ...]]:
    astuple = msgspec.structs.astuple
    return [(*astuple(r), recency(r)) for r in runs]


def state_params(states: Sequence[RunState]) -> list[tuple[Any, ...]]:
    encode = _json.encode
    return [(s.company_id, s.run_id, encode(s).decode()) for s in states]


def deep_params(deeps: Sequence[DeepRecord]) -> list[tuple[Any, ...]]:
    astuple = msgspec.structs.astuple
    return [astuple(d) for d in deeps]


def _error(exc: sqlite3.Error) -> SinkError:
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return SinkUnavailable(f"sqlite sink: {text}")
    return SinkError(f"sqlite sink: {text}")


class _Database:
    """A writer connection (one transaction at a time) and a reader connection."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.writer: aiosqlite.Connection | None = None
        self.reader: aiosqlite.Connection | None = None
        self.write_lock = asyncio.Lock()

    async def open(self, schema: str) -> None:
        try:
            self.writer = await self._connect()
            await self.writer.create_function("stepstream_splice", 3, splice, deterministic=True)
            await self.writer.execute_fetchall("PRAGMA journal_mode=WAL")
            await self.writer.executescript(f"BEGIN IMMEDIATE;\n{schema}\nCOMMIT;")
            self.reader = await self._connect()
        except sqlite3.Error as exc:
            await self.close()
            raise _error(exc) from exc

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None, cached_statements=64)
        await conn.execute_fetchall(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        await conn.execute_fetchall("PRAGMA synchronous=NORMAL")
        return conn

    async def transaction(self, body: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        """Run ``body`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT``; roll back on any error."""
        conn = self.writer
        if conn is None:
            raise SinkError("sqlite sink: store is closed")
        async with self.write_lock:
            try:
                await conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise _error(exc) from exc
            try:
                result = await body(conn)
                await conn.execute("COMMIT")
                return result
            except BaseException as exc:
                if conn.in_transaction:
                    await conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise _error(exc) from exc
                raise

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Any]:
        conn = self.reader
        if conn is None:
            raise SinkError("sqlite sink: store is closed")
        try:
            return list(await conn.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise _error(exc) from exc

    async def close(self) -> None:
        for conn in (self.reader, self.writer):
            if conn is not None:
                await conn.close()
        self.reader = self.writer = None


_SELECT_STEPS = f"SELECT {', '.join(_STEP_COLS)} FROM run_steps WHERE company_id = ? AND run_id = ? ORDER BY step_seq"
_SELECT_RUN = f"SELECT {', '.join(_RUN_COLS)} FROM runs"
_SELECT_DEEP = (
    f"SELECT {', '.join(_DEEP_COLS)} FROM run_step_details WHERE company_id = ? AND run_id = ? ORDER BY step_seq"
)
_RUN_BOOLS = tuple(f.name for f in msgspec.structs.fields(RunRecord) if f.type is bool)


def _step(row: Sequence[Any]) -> StepRecord:
    values = dict(zip(_STEP_COLS, row, strict=True))
    if values["arguments"] is not None:
        values["arguments"] = msgspec.json.decode(values["arguments"])
    return StepRecord(**values)


def _run(row: Sequence[Any]) -> RunRecord:
    values = dict(zip(_RUN_COLS, row, strict=True))
    for name in _RUN_BOOLS:
        values[name] = bool(values[name])
    return RunRecord(**values)


def _deep(row: Sequence[Any]) -> DeepRecord:
    values = dict(zip(_DEEP_COLS, row, strict=True))
    values["clipped"] = bool(values["clipped"])
    return DeepRecord(**values)


class SqliteStepStore:
    """Steps, runs and states in one SQLite file; one transaction per write."""

    capabilities = CAPABILITIES

    def __init__(self, path: str) -> None:
        self._db = _Database(path)

    async def open(self) -> SqliteStepStore:
        await self._db.open(step_schema())
        return self

    async def write(
        self,
        steps: Sequence[StepRecord],
        runs: Sequence[RunRecord] = (),
        states: Sequence[RunState] = (),
    ) -> None:
        if not (steps or runs or states):
            return
        batches = [
            (sql, params)
            for sql, params in (
                (_UPSERT_STEP, step_params(steps)),
                (_UPSERT_RUN, run_params(runs)),
                (_UPSERT_STATE, state_params(states)),
            )
            if params
        ]

        async def body(conn: aiosqlite.Connection) -> None:
            for sql, params in batches:
                await conn.executemany(sql, params)

        await self._db.transaction(body)

    async def load_states(self, company_id: str, run_ids: Sequence[str]) -> dict[str, RunState]:
        if not run_ids:
            return {}
        rows = await self._db.fetch(
            "SELECT run_id, state FROM run_state WHERE company_id = ? AND run_id IN (SELECT value FROM json_each(?))",
            (company_id, _json.encode(list(run_ids)).decode()),
        )
        return {run_id: _state_decoder.decode(state) for run_id, state in rows}

    async def get_run(self, company_id: str, run_id: str) -> RunRecord | None:
        rows = await self._db.fetch(f"{_SELECT_RUN} WHERE company_id = ? AND run_id = ?", (company_id, run_id))
        return _run(rows[0]) if rows else None

    async def list_runs(self, company_id: str, *, limit: int = 50, before: str | None = None) -> list[RunRecord]:
        return (await self.list_runs_page(company_id, limit=limit, before=before)).runs

    async def list_runs_page(self, company_id: str, *, limit: int = 50, before: str | None = None) -> RunsPage:
        check_limit(limit)
        order = "ORDER BY recency DESC, run_id DESC LIMIT ?"
        if before is None:
            rows = await self._db.fetch(f"{_SELECT_RUN} WHERE company_id = ? {order}", (company_id, limit + 1))
        else:
            after_recency, after_run = decode_cursor(before)
            rows = await self._db.fetch(
                f"{_SELECT_RUN} WHERE company_id = ? AND (recency, run_id) < (?, ?) {order}",
                (company_id, after_recency, after_run, limit + 1),
            )
        return RunsPage(*page([_run(r) for r in rows], limit))

    async def get_steps(self, company_id: str, run_id: str) -> list[StepRecord]:
        return [_step(r) for r in await self._db.fetch(_SELECT_STEPS, (company_id, run_id))]

    async def close(self) -> None:
        await self._db.close()


class SqliteDeepStore:
    """Deep rows in ``run_step_details``; clipped at the port, one transaction per write."""

    capabilities = CAPABILITIES

    def __init__(self, path: str, limits: Limits | None = None) -> None:
        self._db = _Database(path)
        self._limits = limits

    async def open(self) -> SqliteDeepStore:
        await self._db.open(deep_schema())
        return self

    async def write(self, deeps: Sequence[DeepRecord]) -> None:
        if not deeps:
            return
        params = deep_params(clip_batch(deeps, self._limits))

        async def body(conn: aiosqlite.Connection) -> None:
            await conn.executemany(_UPSERT_DEEP, params)

        await self._db.transaction(body)

    async def get_deep(self, company_id: str, run_id: str) -> list[DeepRecord]:
        return [_deep(r) for r in await self._db.fetch(_SELECT_DEEP, (company_id, run_id))]

    async def list_deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        rows = await self._db.fetch(_LIST_DEEP_RUNS, (company_id,))
        return [(run_id, ts) for run_id, ts in rows]

    async def purge_run(self, company_id: str, run_id: str) -> int:
        async def body(conn: aiosqlite.Connection) -> int:
            cursor = await conn.execute(
                "DELETE FROM run_step_details WHERE company_id = ? AND run_id = ?", (company_id, run_id)
            )
            return cursor.rowcount

        return await self._db.transaction(body)

    async def purge_company(self, company_id: str) -> int:
        async def body(conn: aiosqlite.Connection) -> int:
            cursor = await conn.execute("DELETE FROM run_step_details WHERE company_id = ?", (company_id,))
            return cursor.rowcount

        return await self._db.transaction(body)

    async def prune(self, company_id: str, keep: int) -> list[str]:
        check_keep(keep)

        async def body(conn: aiosqlite.Connection) -> list[str]:
            # Ranking and deleting in one transaction: no write can land in between,
            # so no surviving run is torn and no dropped run is half-gone.
            ranked = await conn.execute_fetchall(_LIST_DEEP_RUNS, (company_id,))
            dropped = [run_id for run_id, _ in list(ranked)[keep:]]
            if dropped:
                await conn.executemany(
                    "DELETE FROM run_step_details WHERE company_id = ? AND run_id = ?",
                    [(company_id, run_id) for run_id in dropped],
                )
            return dropped

        return await self._db.transaction(body)

    async def close(self) -> None:
        await self._db.close()


_LIST_DEEP_RUNS = (
    "SELECT run_id, max(ts) AS last FROM run_step_details WHERE company_id = ? "
    "GROUP BY run_id ORDER BY last DESC, run_id DESC"
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
