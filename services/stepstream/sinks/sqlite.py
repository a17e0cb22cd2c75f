"""``sqlite:///path.db``: the embedded default; writes in a child process
(``sinks.sqlite_writer``), reads via aiosqlite.

The path follows the SQLAlchemy convention: ``sqlite:///stepstream.db`` is
relative to the working directory, ``sqlite:////var/lib/stepstream.db`` is
absolute. The step store and the deep store may share one file (each creates
only its own tables) or use two.

Schema (created if missing; columns mirror the record fields)::

    run_steps         PRIMARY KEY (company_id, run_id, step_seq), WITHOUT ROWID;
                      arguments is JSON text
    runs              PRIMARY KEY (company_id, run_id), WITHOUT ROWID;
                      environment and failure are JSON text; plus
                      recency = coalesce(started_at, last_event_at, '') and the
                      index runs_recency (company_id, recency DESC, run_id DESC)
    run_state         PRIMARY KEY (company_id, run_id), WITHOUT ROWID; state is the
                      msgspec JSON of the RunState
    run_step_details  arguments and output are the JSON text of the body value;
                      PRIMARY KEY (company_id, run_id, step_seq) (a rowid table:
                      bodies are large), index run_step_details_recency
                      (company_id, run_id, ts) that also covers list_deep_runs
    deep_runs         PRIMARY KEY (company_id, run_id), WITHOUT ROWID: the retention
                      index (rank, last_ts, received_at, version, pruned_at;
                      ``sinks.retention``), upserted in the same transaction as
                      the bodies, after the check that drops bodies of pruned runs

**Writes** are ``executemany`` upserts with prepared statements, one
``BEGIN IMMEDIATE`` transaction per ``write`` call on a dedicated writer
connection, which lives in a child process (``sinks.sqlite_writer``: one
message per transaction, so building and binding rows never competes with the
worker's folding for the GIL); the transaction bodies are the
:data:`OPERATIONS` below. Reads use a second connection in this process (aiosqlite)
and, under WAL, see only committed batches. A step batch first reads, inside that transaction, the stored
``last_seq`` of the runs it carries states for (a primary-key lookup per run,
``json_extract`` of the state) and drops the stale runs (``semantics.admit``),
so the check and the write are one atomic step for every writer of the file.
The merge is SQL: ``col = coalesce(excluded.col, col)``,
``clipped = max(clipped, excluded.clipped)``, ``ts = max(ts, excluded.ts)``
and, for every reasoning write,
``stepstream_splice(reasoning, offset, excluded.reasoning)``: a SQL function
registered on the writer connection that is ``core.merge.apply_reasoning`` (the
one definition of the rule, so SQLite cannot drift from it)
(``stored[:offset] + written + stored[offset + len(written):]``). SQLite's own
``substr`` and ``length`` count characters but stop at a NUL character (U+0000,
legal in JSON text and so in reasoning), which would silently drop text. Plain
``sqlite3`` can read the file; only this upsert needs the function.

PRAGMAs: ``journal_mode=WAL``, ``synchronous=FULL`` by default (the WAL is
synced at every commit, so a batch that returned survives a power cut;
``?synchronous=normal`` syncs only at checkpoints: a committed batch survives a
process kill, a power cut may lose the last batches, never corrupt), and a busy
timeout (``?busy_timeout_ms=``, default 30000) so several processes can share
the file. ``durability`` reads the setting back from the connection.

**Errors.** ``SQLITE_BUSY``, ``SQLITE_LOCKED``, ``SQLITE_IOERR`` ("disk I/O
error"), ``SQLITE_CANTOPEN`` ("unable to open") and ``SQLITE_FULL`` (disk full)
are :class:`SinkUnavailable` (retriable); any other SQLite error is a
:class:`SinkError`. Any other exception while writing (``OverflowError`` for an
integer beyond 64 bits, ``UnicodeEncodeError`` for a lone surrogate) rolls the
transaction back and becomes a ``SinkError`` naming the table and the exception
type, never the value.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import ConfigError, SinkError, SinkUnavailable
from stepstream.sinks.ports import Capabilities, DeepRun, RunsPage
from stepstream.sinks.retention import Clock, IndexEntry, batch_ranks, merge_index, now_text, prune_via_marks
from stepstream.sinks.sqlite_writer import WriterProcess
from stepstream.sinks.semantics import (
    ClipHook,
    RunKey,
    admit,
    apply_reasoning,
    check_keep,
    check_limit,
    clip_batch,
    decode_cursor,
    page,
    recency,
    state_keys,
    unstorable,
)

try:
    import aiosqlite
except ImportError as exc:  # pragma: no cover - a core dependency
    raise ConfigError("the sqlite sink needs aiosqlite: pip install stepstream") from exc

CAPABILITIES = Capabilities(atomic_batch=True, shared_storage=True, monotonic_states=True)
BUSY_TIMEOUT_MS = 30_000
SYNCHRONOUS = "FULL"
_SYNCHRONOUS_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
# Primary result codes worth a retry: busy, locked, I/O error, cannot open, disk full.
RETRIABLE_CODES = frozenset(
    {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_FULL}
)

T = TypeVar("T")

_STEP_COLS = StepRecord.__struct_fields__
_RUN_COLS = RunRecord.__struct_fields__
_DEEP_COLS = tuple(f for f in DeepRecord.__struct_fields__ if f != "reasoning_offset")
_STEP_ARGS = _STEP_COLS.index("arguments")
_RUN_JSON = (_RUN_COLS.index("environment"), _RUN_COLS.index("failure"))
_DEEP_JSON_NAMES = ("arguments", "output", "call_event", "result_event")
_DEEP_JSON = tuple(DeepRecord.__struct_fields__.index(name) for name in _DEEP_JSON_NAMES)
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
CREATE TABLE IF NOT EXISTS deep_runs (
  company_id TEXT NOT NULL,
  run_id TEXT NOT NULL,
  rank TEXT NOT NULL,
  last_ts TEXT NOT NULL,
  received_at TEXT NOT NULL,
  version INTEGER NOT NULL,
  pruned_at TEXT,
  PRIMARY KEY (company_id, run_id)
) WITHOUT ROWID;
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
# A run record replaces whole, except the compactor's mark, which a worker's write (None) keeps.
_UPSERT_RUN = _upsert(
    "runs",
    (*_RUN_COLS, "recency"),
    _KEY2,
    lambda c: f"coalesce(excluded.{c}, {c})" if c == "deep_pruned_at" else f"excluded.{c}",
)
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
        f"ELSE stepstream_splice(reasoning, {off}, excluded.reasoning) END, "
        "arguments = coalesce(excluded.arguments, arguments), "
        "output = coalesce(excluded.output, output), "
        "clipped = max(clipped, excluded.clipped), "
        "call_event = coalesce(excluded.call_event, call_event), "
        "result_event = coalesce(excluded.result_event, result_event)"
    )


_UPSERT_DEEP = _deep_upsert()

# Stored last_seq of the given runs: one primary-key search per key (the CROSS JOIN
# keeps the key list as the outer loop). Keys are bound parameters, not JSON, as
# SQLite's JSON functions cut text at a NUL character.
_KEYS_PER_QUERY = 256


def _stored_last_seq_sql(count: int) -> str:
    values = ", ".join(["(?, ?)"] * count)
    return (
        f"WITH k(company_id, run_id) AS (VALUES {values}) "
        "SELECT s.company_id, s.run_id, json_extract(s.state, '$.last_seq') "
        "FROM k CROSS JOIN run_state AS s USING (company_id, run_id)"
    )


def _padded(count: int) -> int:
    """``count`` rounded up to a power of two, so a few statement texts serve every size."""
    return 1 << (count - 1).bit_length()


def _key_chunks(keys: Sequence[tuple[Any, ...]]) -> list[tuple[int, list[Any]]]:
    """``(size, flat params)`` per chunk of at most :data:`_KEYS_PER_QUERY` keys, each
    padded to a power of two by repeating its last key (a repeat matches nothing new)."""
    out = []
    for start in range(0, len(keys), _KEYS_PER_QUERY):
        chunk = list(keys[start : start + _KEYS_PER_QUERY])
        size = _padded(len(chunk))
        chunk += [chunk[-1]] * (size - len(chunk))
        out.append((size, [v for key in chunk for v in key]))
    return out


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
    astuple, encode = msgspec.structs.astuple, _json.encode
    out = []
    for r in runs:
        row = list(astuple(r))
        for i in _RUN_JSON:  # structured fields are JSON text
            if row[i] is not None:
                row[i] = encode(row[i]).decode()
        out.append((*row, recency(r)))
    return out


def state_params(states: Sequence[RunState]) -> list[tuple[Any, ...]]:
    encode = _json.encode
    return [(s.company_id, s.run_id, encode(s).decode()) for s in states]


def deep_params(deeps: Sequence[DeepRecord]) -> list[tuple[Any, ...]]:
    astuple, encode = msgspec.structs.astuple, _json.encode
    out = []
    for d in deeps:
        row = astuple(d)
        if d.arguments is not None or d.output is not None or d.call_event is not None or d.result_event is not None:
            row = list(row)
            for i in _DEEP_JSON:  # bodies and envelopes are JSON values: stored as their JSON text
                if row[i] is not None:
                    row[i] = encode(row[i]).decode()
        out.append(tuple(row))
    return out


def is_retriable(exc: sqlite3.Error) -> bool:
    """Whether the error is transient (see the module doc), by its SQLite result code."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # raised by the sqlite3 module itself, not by SQLite
        return False
    return (code & 0xFF) in RETRIABLE_CODES


def _error(exc: sqlite3.Error, what: str) -> SinkError:
    kind = SinkUnavailable if is_retriable(exc) else SinkError
    return kind(f"sqlite sink: {what}: {exc}")


def _write_rows(
    conn: sqlite3.Connection,
    table: str,
    sql: str,
    params_of: Callable[[Sequence[Any]], list[tuple[Any, ...]]],
    records: Sequence[Any],
) -> None:
    """``executemany`` of ``records`` into ``table``; a value SQLite cannot hold is a
    :class:`SinkError` naming the table (the caller's transaction rolls back)."""
    try:
        conn.executemany(sql, params_of(records))
    except sqlite3.Error as exc:
        raise _error(exc, f"write {table}") from exc
    except Exception as exc:  # OverflowError, UnicodeEncodeError, ...: never retriable
        raise unstorable("sqlite", table, exc) from None


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
            raise _error(exc, f"open {self.path}") from exc
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
            raise _error(exc, "read") from exc

    async def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            await reader.close()
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.close()


def open_writer(path: str, synchronous: str, busy_timeout_ms: int, schema: str) -> tuple[sqlite3.Connection, str]:
    """The writer connection (in the writer process): PRAGMAs, the splice function,
    WAL, and the ``schema`` (``steps`` or ``deep``) made if missing."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, cached_statements=64)
    except sqlite3.Error as exc:
        raise _error(exc, f"open {path}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.create_function("stepstream_splice", 3, apply_reasoning, deterministic=True)
        conn.execute("PRAGMA journal_mode=WAL")
        ((level,),) = conn.execute("PRAGMA synchronous").fetchall()
        tables = {"steps": step_schema, "deep": deep_schema}[schema]()
        conn.executescript(f"BEGIN IMMEDIATE;\n{tables}\nCOMMIT;")
    except sqlite3.Error as exc:
        conn.close()
        raise _error(exc, f"open {path}") from exc
    except BaseException:
        conn.close()
        raise
    return conn, f"synchronous={_SYNCHRONOUS_NAMES.get(level, level)}"


def _transactional(body: Callable[..., T]) -> Callable[..., T]:
    """``body(conn, *args)`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on
    any error; raises only :class:`SinkError`."""

    def run(conn: sqlite3.Connection, *args: Any) -> T:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _error(exc, "begin") from exc
        try:
            result = body(conn, *args)
            conn.execute("COMMIT")
            return result
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error, ValueError):
                # The error being raised is the one that matters, not a failed rollback.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _error(exc, "write") from exc
            if isinstance(exc, Exception) and not isinstance(exc, SinkError):
                raise SinkError(f"sqlite sink: write failed: {type(exc).__name__}") from None
            raise

    return run


def _range(after: int | None, limit: int | None) -> tuple[int, int]:
    """``(after, limit)`` parameters of a range select: -1 is "from the first" and "no limit"."""
    return (-1 if after is None else after, -1 if limit is None else check_limit(limit))


def _script(conn: sqlite3.Connection, sql: str) -> None:
    try:
        conn.executescript(sql)
    except sqlite3.Error as exc:
        raise _error(exc, "change the schema") from exc


# A range of a run's rows (``step_seq > ?``, ``LIMIT ?``; -1 and -1 for all) on the primary key.
_SELECT_STEPS = (
    f"SELECT {', '.join(_STEP_COLS)} FROM run_steps WHERE company_id = ? AND run_id = ? AND step_seq > ? "
    "ORDER BY step_seq LIMIT ?"
)
_SELECT_RUN = f"SELECT {', '.join(_RUN_COLS)} FROM runs"
_RUN_BOOLS = tuple(f.name for f in msgspec.structs.fields(RunRecord) if f.type is bool)


def _stored_last_seq(conn: sqlite3.Connection, keys: Sequence[RunKey]) -> dict[RunKey, int]:
    stored: dict[RunKey, int] = {}
    for size, params in _key_chunks(keys):
        for company_id, run_id, last_seq in conn.execute(_stored_last_seq_sql(size), params):
            stored[(company_id, run_id)] = last_seq
    return stored


def _decode_state(text: str) -> RunState:
    try:
        return _state_decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise SinkError(f"sqlite sink: a stored run state is not valid: {exc}") from None


def _step(row: Sequence[Any]) -> StepRecord:
    values = dict(zip(_STEP_COLS, row, strict=True))
    if values["arguments"] is not None:
        values["arguments"] = msgspec.json.decode(values["arguments"])
    return StepRecord(**values)


def _run(row: Sequence[Any]) -> RunRecord:
    values = dict(zip(_RUN_COLS, row, strict=True))
    for name in _RUN_BOOLS:
        values[name] = bool(values[name])
    for i in _RUN_JSON:
        name = _RUN_COLS[i]
        if values[name] is not None:
            values[name] = msgspec.json.decode(values[name])
    return msgspec.convert(values, RunRecord)


def _deep(row: Sequence[Any]) -> DeepRecord:
    values = dict(zip(_DEEP_COLS, row, strict=True))
    values["clipped"] = bool(values["clipped"])
    for name in _DEEP_JSON_NAMES:
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
        missing = [c for c in _RUN_COLS if c not in have]
        if missing:
            types = {f.name: _SQL_TYPES.get(f.type, "TEXT") for f in msgspec.structs.fields(RunRecord)}
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
        for size, params in _key_chunks([(run_id,) for run_id in dict.fromkeys(run_ids)]):
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
        missing = [c for c in _DEEP_COLS if c not in have]
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
    f"SELECT {', '.join(_DEEP_COLS)} FROM run_step_details WHERE company_id = ?1 AND run_id = ?2 "
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
_UPSERT_INDEX = (
    "INSERT INTO deep_runs (company_id, run_id, rank, last_ts, received_at, version) VALUES (?, ?, ?, ?, ?, 1) "
    "ON CONFLICT (company_id, run_id) DO UPDATE SET rank = max(rank, excluded.rank), "
    "last_ts = max(last_ts, excluded.last_ts), received_at = max(received_at, excluded.received_at), "
    "version = version + 1"
)


def _pruned_keys(conn: sqlite3.Connection, keys: Sequence[RunKey]) -> set[RunKey]:
    """Those runs that are marked pruned (one primary-key search per key)."""
    found: set[RunKey] = set()
    for size, params in _key_chunks(keys):
        values = ", ".join(["(?, ?)"] * size)
        rows = conn.execute(
            f"WITH k(company_id, run_id) AS (VALUES {values}) SELECT d.company_id, d.run_id "
            "FROM k CROSS JOIN deep_runs AS d USING (company_id, run_id) WHERE d.pruned_at IS NOT NULL",
            params,
        )
        found.update((c, r) for c, r in rows)
    return found


# -- the writer's operations (run in the writer process, ``sinks.sqlite_writer``) --------


def _write_steps(
    conn: sqlite3.Connection, steps: list[StepRecord], runs: list[RunRecord], states: list[RunState]
) -> list[RunKey]:
    # Inside BEGIN IMMEDIATE: no other writer can land between the check and the rows.
    stored = _stored_last_seq(conn, state_keys(states))
    batch = admit(steps, runs, states, stored)
    for table, sql, params_of, records in (
        ("run_steps", _UPSERT_STEP, step_params, batch.steps),
        ("runs", _UPSERT_RUN, run_params, batch.runs),
        ("run_state", _UPSERT_STATE, state_params, batch.states),
    ):
        if records:
            _write_rows(conn, table, sql, params_of, records)
    return batch.skipped


def _write_deep(conn: sqlite3.Connection, deeps: list[DeepRecord], received: str, limits: Limits | None) -> list[str]:
    """Clip the rows (``semantics.clip_batch``), then write them; returns the name of
    every body the clip cut, for the store's ``on_clip`` hook."""
    cut: list[str] = []
    deeps = clip_batch(deeps, limits, cut.append)
    # Inside BEGIN IMMEDIATE: the tombstone check, the index and the rows are one step.
    keys = list(dict.fromkeys((d.company_id, d.run_id) for d in deeps))
    pruned = _pruned_keys(conn, keys)
    kept = [d for d in deeps if (d.company_id, d.run_id) not in pruned] if pruned else deeps
    if not kept:
        return cut
    ranks = [(c, r, rank, last, received) for (c, r), (last, rank) in batch_ranks(kept, received).items()]
    _write_rows(conn, "deep_runs", _UPSERT_INDEX, list, ranks)
    _write_rows(conn, "run_step_details", _UPSERT_DEEP, deep_params, kept)
    return cut


def _mark_deep_pruned(conn: sqlite3.Connection, company_id: str, run_ids: list[str], at: str) -> int:
    cursor = conn.executemany(
        "UPDATE runs SET deep_pruned_at = ? WHERE company_id = ? AND run_id = ? AND deep_pruned_at IS NULL",
        [(at, company_id, r) for r in run_ids],
    )
    return cursor.rowcount


def _delete_runs(conn: sqlite3.Connection, company_id: str, run_ids: list[str]) -> int:
    keys = [(company_id, r) for r in run_ids]
    for table in ("run_steps", "run_state"):
        conn.executemany(f"DELETE FROM {table} WHERE company_id = ? AND run_id = ?", keys)
    return conn.executemany("DELETE FROM runs WHERE company_id = ? AND run_id = ?", keys).rowcount


def _mark_pruned(conn: sqlite3.Connection, company_id: str, runs: list[tuple[str, int]], at: str) -> list[str]:
    marked = []
    for run_id, version in runs:
        if version == 0:
            cursor = conn.execute(
                "INSERT INTO deep_runs (company_id, run_id, rank, last_ts, received_at, version, pruned_at) "
                "VALUES (?, ?, '', '', '', 0, ?) ON CONFLICT (company_id, run_id) DO NOTHING",
                (company_id, run_id, at),
            )
        else:
            cursor = conn.execute(
                "UPDATE deep_runs SET pruned_at = ? WHERE company_id = ? AND run_id = ? "
                "AND version = ? AND pruned_at IS NULL",
                (at, company_id, run_id, version),
            )
        if cursor.rowcount == 1:
            marked.append(run_id)
    return marked


def _delete_pruned(conn: sqlite3.Connection, company_id: str, run_ids: list[str]) -> int:
    cursor = conn.executemany(
        "DELETE FROM run_step_details WHERE company_id = ?1 AND run_id = ?2 AND EXISTS (SELECT 1 FROM "
        "deep_runs WHERE company_id = ?1 AND run_id = ?2 AND pruned_at IS NOT NULL)",
        [(company_id, r) for r in run_ids],
    )
    return cursor.rowcount


def _purge_run(conn: sqlite3.Connection, company_id: str, run_id: str) -> int:
    cursor = conn.execute("DELETE FROM run_step_details WHERE company_id = ? AND run_id = ?", (company_id, run_id))
    conn.execute("DELETE FROM deep_runs WHERE company_id = ? AND run_id = ? AND pruned_at IS NULL", (company_id, run_id))
    return cursor.rowcount


def _purge_company(conn: sqlite3.Connection, company_id: str) -> int:
    cursor = conn.execute("DELETE FROM run_step_details WHERE company_id = ?", (company_id,))
    conn.execute("DELETE FROM deep_runs WHERE company_id = ? AND pruned_at IS NULL", (company_id,))
    return cursor.rowcount


#: ``name: (function(conn, *args), argument types)``: what the writer process runs, one
#: transaction each (``script`` runs its own). The types decode the MessagePack request.
OPERATIONS: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "write_steps": (_transactional(_write_steps), (list[StepRecord], list[RunRecord], list[RunState])),
    "write_deep": (_transactional(_write_deep), (list[DeepRecord], str, Limits | None)),
    "mark_deep_pruned": (_transactional(_mark_deep_pruned), (str, list[str], str)),
    "delete_runs": (_transactional(_delete_runs), (str, list[str])),
    "mark_pruned": (_transactional(_mark_pruned), (str, list[tuple[str, int]], str)),
    "delete_pruned": (_transactional(_delete_pruned), (str, list[str])),
    "purge_run": (_transactional(_purge_run), (str, str)),
    "purge_company": (_transactional(_purge_company), (str,)),
    "script": (_script, (str,)),
}


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///`` URL (SQLAlchemy convention)."""
    path = url[len("sqlite:///") :].split("?", 1)[0]
    if not path or path == ":memory:":
        raise ConfigError(
            f"sqlite sink needs a file path, e.g. sqlite:///stepstream.db (got {url!r}); "
            "use memory:// for a throwaway store"
        )
    return path
