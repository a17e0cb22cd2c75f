"""The SQLite sink's synchronous side: the schema, the parameter rows, the writer
connection and the transactions it runs (:data:`OPERATIONS`).

Everything here runs in the writer process (``python -m stepstream.sinks.sqlite_writer``),
and the schema bits (columns, :func:`key_chunks`, :func:`is_retriable`) are shared with
the reader side, ``sinks.sqlite``. The dependency is one way: ``sinks.sqlite`` ->
``sinks.sqlite_writer`` (the transport) -> this module; nothing here imports either.

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
``BEGIN IMMEDIATE`` transaction per operation (:func:`_transactional`). A step
batch first reads, inside that transaction, the stored ``last_seq`` of the runs it
carries states for (a primary-key lookup per run, ``json_extract`` of the state)
and drops the stale runs (``semantics.admit``), so the check and the write are one
atomic step for every writer of the file. The merge is SQL:
``col = coalesce(excluded.col, col)``, ``clipped = max(clipped, excluded.clipped)``,
``ts = max(ts, excluded.ts)`` and, for every reasoning write,
``stepstream_splice(reasoning, offset, excluded.reasoning)``: a SQL function
registered on the writer connection that is ``core.merge.apply_reasoning`` (the
one definition of the rule, so SQLite cannot drift from it)
(``stored[:offset] + written + stored[offset + len(written):]``). SQLite's own
``substr`` and ``length`` count characters but stop at a NUL character (U+0000,
legal in JSON text and so in reasoning), which would silently drop text. Plain
``sqlite3`` can read the file; only this upsert needs the function.

PRAGMAs (:func:`open_writer`): ``journal_mode=WAL``, the ``synchronous`` level and
the busy timeout the store was opened with.

**Errors.** ``SQLITE_BUSY``, ``SQLITE_LOCKED``, ``SQLITE_IOERR`` ("disk I/O
error"), ``SQLITE_CANTOPEN`` ("unable to open") and ``SQLITE_FULL`` (disk full)
are :class:`SinkUnavailable` (retriable); any other SQLite error is a
:class:`SinkError`. Any other exception while writing (``OverflowError`` for an
integer beyond 64 bits, ``UnicodeEncodeError`` for a lone surrogate) rolls the
transaction back and becomes a ``SinkError`` naming the table and the exception
type, never the value.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from stepstream.core.caps import clip_chunk, stored_body
from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import SinkError, SinkUnavailable
from stepstream.sinks.retention import batch_ranks
from stepstream.sinks.semantics import (
    DEFAULT_LIMITS,
    KEPT_RUN_FIELDS,
    RunKey,
    admit,
    apply_reasoning,
    clip_batch,
    recency,
    state_keys,
    unstorable,
)

_SYNCHRONOUS_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
# Primary result codes worth a retry: busy, locked, I/O error, cannot open, disk full.
RETRIABLE_CODES = frozenset(
    {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_FULL}
)

T = TypeVar("T")

STEP_COLS = StepRecord.__struct_fields__
RUN_COLS = RunRecord.__struct_fields__
DEEP_COLS = tuple(f for f in DeepRecord.__struct_fields__ if f != "reasoning_offset")
_STEP_ARGS = STEP_COLS.index("arguments")
RUN_JSON = (RUN_COLS.index("environment"), RUN_COLS.index("failure"))
DEEP_JSON_NAMES = ("arguments", "output", "call_event", "result_event")
_KEY3 = ("company_id", "run_id", "step_seq")
_KEY2 = ("company_id", "run_id")
SQL_TYPES = {int: "INTEGER", bool: "INTEGER", str: "TEXT"}


def _columns(record_type: type, names: Sequence[str], overrides: dict[str, str]) -> str:
    fields = {f.name: f for f in msgspec.structs.fields(record_type)}
    out = []
    for name in names:
        if name in overrides:
            out.append(f"{name} {overrides[name]}")
            continue
        kind = SQL_TYPES.get(fields[name].type, "TEXT")  # optionals and literals are TEXT
        required = fields[name].required or fields[name].default is not None
        out.append(f"{name} {kind}{' NOT NULL' if required else ''}")
    return ",\n  ".join(out)


def step_schema() -> str:
    return f"""
CREATE TABLE IF NOT EXISTS run_steps (
  {_columns(StepRecord, STEP_COLS, {"arguments": "TEXT"})},
  PRIMARY KEY (company_id, run_id, step_seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS runs (
  {_columns(RunRecord, RUN_COLS, {})},
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
  {_columns(DeepRecord, DEEP_COLS, {"clipped": "INTEGER NOT NULL DEFAULT 0"})},
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
    "run_steps", STEP_COLS, _KEY3, lambda c: "excluded.kind" if c == "kind" else f"coalesce(excluded.{c}, {c})"
)
# A run record replaces whole, except the compactor's mark and the environment (written
# once, with its run_start), which a write of None keeps (core.merge.merge_run).
_UPSERT_RUN = _upsert(
    "runs",
    (*RUN_COLS, "recency"),
    _KEY2,
    lambda c: f"coalesce(excluded.{c}, {c})" if c in KEPT_RUN_FIELDS else f"excluded.{c}",
)
_UPSERT_STATE = _upsert("run_state", (*_KEY2, "state"), _KEY2, lambda c: f"excluded.{c}")


def _deep_upsert() -> str:
    # Parameters are the DeepRecord fields in order (msgspec.structs.astuple), so
    # ?N numbers them; reasoning_offset is used only by the positional merge.
    n = {name: i + 1 for i, name in enumerate(DeepRecord.__struct_fields__)}
    values = ", ".join(f"?{n[c]}" for c in DEEP_COLS)
    off = f"?{n['reasoning_offset']}"
    return (
        f"INSERT INTO run_step_details ({', '.join(DEEP_COLS)}) VALUES ({values}) "
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


def key_chunks(keys: Sequence[tuple[Any, ...]]) -> list[tuple[int, list[Any]]]:
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
        for i in RUN_JSON:  # structured fields are JSON text
            if row[i] is not None:
                row[i] = encode(row[i]).decode()
        out.append((*row, recency(r)))
    return out


def state_params(states: Sequence[RunState]) -> list[tuple[Any, ...]]:
    encode = _json.encode
    return [(s.company_id, s.run_id, encode(s).decode()) for s in states]


_DEEP_BODY_CAPS = (
    (DeepRecord.__struct_fields__.index("arguments"), "arguments", "arguments_chars"),
    (DeepRecord.__struct_fields__.index("output"), "output", "output_chars"),
)
_DEEP_REASONING = DeepRecord.__struct_fields__.index("reasoning")
_DEEP_OFFSET = DeepRecord.__struct_fields__.index("reasoning_offset")
_DEEP_CLIPPED = DeepRecord.__struct_fields__.index("clipped")
_DEEP_ENVELOPES = tuple(DeepRecord.__struct_fields__.index(n) for n in ("call_event", "result_event"))


def clipped_deep_params(deeps: Sequence[DeepRecord], limits: Limits | None, cut: list[str]) -> list[tuple[Any, ...]]:
    """``deep_params(clip_batch(deeps, limits, cut.append))`` with each body encoded
    once: the clip of ``core.caps`` (``clip_chunk`` for reasoning, ``stored_body`` for
    the JSON bodies, which measures a body by the text that is stored) instead of
    a clip that encodes every non-string body to measure it and a second encoding
    to store it. ``cut`` hears the name of every body clipped here."""
    limits = limits or DEFAULT_LIMITS
    caps = [(i, name, getattr(limits, attr)) for i, name, attr in _DEEP_BODY_CAPS]
    reasoning_cap = limits.reasoning_chars
    astuple, encode = msgspec.structs.astuple, _json.encode
    out = []
    for d in deeps:
        row = list(astuple(d))
        clipped = False
        reasoning = row[_DEEP_REASONING]
        if reasoning is not None:
            text, offset, cut_here = clip_chunk(reasoning, row[_DEEP_OFFSET], reasoning_cap)
            if cut_here:
                row[_DEEP_REASONING], row[_DEEP_OFFSET] = text, offset
                clipped = True
                cut.append("reasoning")
        for i, name, cap in caps:
            value = row[i]
            if value is not None:
                row[i], cut_here = stored_body(value, cap)
                if cut_here:
                    clipped = True
                    cut.append(name)
        if clipped:
            row[_DEEP_CLIPPED] = True
        for i in _DEEP_ENVELOPES:
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


def sqlite_error(exc: sqlite3.Error, what: str) -> SinkError:
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
        raise sqlite_error(exc, f"write {table}") from exc
    except Exception as exc:  # OverflowError, UnicodeEncodeError, ...: never retriable
        raise unstorable("sqlite", table, exc) from None


def open_writer(path: str, synchronous: str, busy_timeout_ms: int, schema: str) -> tuple[sqlite3.Connection, str]:
    """The writer connection (in the writer process): PRAGMAs, the splice function,
    WAL, and the ``schema`` (``steps`` or ``deep``) made if missing."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, cached_statements=64)
    except sqlite3.Error as exc:
        raise sqlite_error(exc, f"open {path}") from exc
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
        raise sqlite_error(exc, f"open {path}") from exc
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
            raise sqlite_error(exc, "begin") from exc
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
                raise sqlite_error(exc, "write") from exc
            if isinstance(exc, Exception) and not isinstance(exc, SinkError):
                raise SinkError(f"sqlite sink: write failed: {type(exc).__name__}") from None
            raise

    return run


def _script(conn: sqlite3.Connection, sql: str) -> None:
    try:
        conn.executescript(sql)
    except sqlite3.Error as exc:
        raise sqlite_error(exc, "change the schema") from exc


def _stored_last_seq(conn: sqlite3.Connection, keys: Sequence[RunKey]) -> dict[RunKey, int]:
    stored: dict[RunKey, int] = {}
    for size, params in key_chunks(keys):
        for company_id, run_id, last_seq in conn.execute(_stored_last_seq_sql(size), params):
            stored[(company_id, run_id)] = last_seq
    return stored


_UPSERT_INDEX = (
    "INSERT INTO deep_runs (company_id, run_id, rank, last_ts, received_at, version) VALUES (?, ?, ?, ?, ?, 1) "
    "ON CONFLICT (company_id, run_id) DO UPDATE SET rank = max(rank, excluded.rank), "
    "last_ts = max(last_ts, excluded.last_ts), received_at = max(received_at, excluded.received_at), "
    "version = version + 1"
)


def _pruned_keys(conn: sqlite3.Connection, keys: Sequence[RunKey]) -> set[RunKey]:
    """Those runs that are marked pruned (one primary-key search per key)."""
    found: set[RunKey] = set()
    for size, params in key_chunks(keys):
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
    # Inside BEGIN IMMEDIATE: the tombstone check, the index and the rows are one step.
    keys = list(dict.fromkeys((d.company_id, d.run_id) for d in deeps))
    pruned = _pruned_keys(conn, keys)
    kept = [d for d in deeps if (d.company_id, d.run_id) not in pruned] if pruned else deeps
    if not kept:
        # The bodies of pruned runs are not written, but a cut is reported all the same.
        clip_batch(deeps, limits, cut.append)
        return cut
    if pruned:
        clip_batch([d for d in deeps if (d.company_id, d.run_id) in pruned], limits, cut.append)
    ranks = [(c, r, rank, last, received) for (c, r), (last, rank) in batch_ranks(kept, received).items()]
    _write_rows(conn, "deep_runs", _UPSERT_INDEX, list, ranks)
    _write_rows(conn, "run_step_details", _UPSERT_DEEP, lambda rows: clipped_deep_params(rows, limits, cut), kept)
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
