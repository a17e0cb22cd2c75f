"""``file:///dir``: append-only JSON lines, one file per record type.

Layout of ``dir`` (created if missing)::

    run-steps.jsonl    StepRecord lines  (step store)
    runs.jsonl         RunRecord lines   (step store)
    run-state.jsonl    RunState lines    (step store)
    run-steps.lock     serialises step-store writers (flock)
    deep-trace.jsonl   DeepRecord lines as written, after the port clip (deep store)
    deep-trace.lock    serialises deep-store writers and rewrites (flock)
    deep-index.jsonl   retention index lines (deep store): ``write`` (a batch stored
                       bodies for the run: its ranks), ``prune`` (the run's bodies are
                       dropped; later ones refused), ``forget`` (a purge removed it)

A line is the msgspec JSON of one *write*, not of a row: a reader folds the lines
in order with the port's merge (field by field, sticky ``clipped``, positional
reasoning), so the last write wins per key. A step-store batch appends its steps,
then its runs, then its states, so a crash never leaves a state ahead of its rows.
Under the same lock it first folds ``run-state.jsonl`` to its end and drops the
runs whose stored state is not behind the batch's (``semantics.admit``), so the
check and the append are one step for every writer of the directory.

**Many processes.** Writers take an exclusive ``flock`` on the lock file, append
the whole batch with one ``write``, and close; if the file does not end in a
newline (a writer died mid-line) the next writer starts on a fresh line first.
Readers take no lock: each store instance follows the files incrementally from
the last complete line it saw and ignores a torn final line (it is read once
completed). A line that is not valid JSON is counted (``bad_lines``) and skipped.

**Purge and prune** rewrite ``deep-trace.jsonl`` without the dropped runs under
the lock (temporary file, fsync, atomic ``os.replace``), so the bodies are gone
from the file, not just hidden. A reader notices the new file by its inode and
reloads it.

**Durability.** By default every write batch ends with an ``fsync`` of each
file it appended to (and of the directory when it created a file, and after a
rewrite's rename), before the lock is released: a batch that returned survives
a power cut. ``file:///dir?fsync=false`` leaves it to the page cache (a killed
process still loses nothing it wrote; a power cut may lose the last batches).
``durability`` is ``"fsync"`` or ``"no fsync"``.

**Errors.** An ``OSError`` becomes :class:`SinkUnavailable` (retriable) for a
full disk or quota (``ENOSPC``, ``EDQUOT``): space can be freed (retention frees
it), a retry appends the batch again after any torn tail (writes are
idempotent), and a file whose append or sync failed is synced again by the next
write. Any other ``OSError`` is a plain :class:`SinkError`: permissions, a
read-only file system, a missing directory, and ``EIO``, since after a failed
``fsync`` the kernel may have dropped the unsynced pages while readers still see
them, so no retry can be trusted to make the batch durable. A record that
cannot be encoded (a lone surrogate in a string) is a ``SinkError`` naming the
file, raised before anything is appended.

Every read refolds only what was appended since the last read, but the whole
folded store lives in memory: this backend is for tests, backfills and small
single-host installs.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import msgspec

from stepstream.core.limits import Limits
from stepstream.core.records import DeepRecord, RunRecord, RunState, StepRecord
from stepstream.errors import SinkError, SinkUnavailable
from stepstream.sinks.ports import NO_FILTER, Capabilities, DeepRun, RunFilter, RunsPage
from stepstream.sinks.retention import Clock, IndexEntry, batch_ranks, fold_write, merge_index, now_text, prune_via_marks
from stepstream.sinks.semantics import (
    ClipHook,
    RunKey,
    admit,
    apply_deep,
    check_keep,
    check_limit,
    clip_batch,
    decode_cursor,
    matches,
    merge_run,
    merge_step,
    newest_first,
    page,
    run_sort_key,
    seq_range,
    state_keys,
    unstorable,
)

CAPABILITIES = Capabilities(atomic_batch=False, shared_storage=True, monotonic_states=True)

STEPS_FILE = "run-steps.jsonl"
RUNS_FILE = "runs.jsonl"
STATES_FILE = "run-state.jsonl"
DEEP_FILE = "deep-trace.jsonl"
INDEX_FILE = "deep-index.jsonl"

T = TypeVar("T")

# Worth a retry: space can be freed. Not EIO: see the module doc.
RETRIABLE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

_encoder = msgspec.json.Encoder()


class _RunKeyOnly(msgspec.Struct):
    company_id: str
    run_id: str


_key_decoder = msgspec.json.Decoder(_RunKeyOnly)


class _Folded(Generic[T]):
    """One JSON-lines file folded into ``rows[(company_id, run_id)]``, read incrementally.

    ``fold(rows_of_run, record)`` applies one line to the run's rows."""

    def __init__(self, path: Path, record_type: type[T], fold: Callable[[dict[RunKey, Any], T], None]) -> None:
        self.path = path
        self._decoder = msgspec.json.Decoder(record_type)
        self._fold = fold
        self._file: Any = None
        self._offset = 0
        self.rows: dict[RunKey, Any] = {}
        self.bad_lines = 0

    def refresh(self) -> None:
        """Fold every complete line appended since the last call."""
        try:
            inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            self._reset(None)
            return
        if self._file is None or os.fstat(self._file.fileno()).st_ino != inode:
            self._reset(open(self.path, "rb"))  # noqa: SIM115 - held open to pin the inode
        self._file.seek(self._offset)
        data = self._file.read()
        end = data.rfind(b"\n") + 1
        if not end:
            return
        self._offset += end
        for line in data[:end].split(b"\n"):
            if not line:
                continue
            try:
                record = self._decoder.decode(line)
            except msgspec.DecodeError:
                self.bad_lines += 1
                continue
            self._fold(self.rows, record)

    def adopt(self, rows: dict[RunKey, Any]) -> None:
        """After our own rewrite under the lock: the new file holds exactly ``rows``."""
        self._reset(open(self.path, "rb"))  # noqa: SIM115
        self._offset = os.fstat(self._file.fileno()).st_size
        self.rows = rows

    def _reset(self, file: Any) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._offset, self.rows, self.bad_lines = file, 0, {}, 0

    def close(self) -> None:
        self._reset(None)


def _fold_step(rows: dict[RunKey, Any], step: StepRecord) -> None:
    run = rows.setdefault((step.company_id, step.run_id), {})
    run[step.step_seq] = merge_step(run.get(step.step_seq), step)


def _fold_whole(rows: dict[RunKey, Any], record: RunRecord | RunState) -> None:
    rows[(record.company_id, record.run_id)] = record


def _fold_run(rows: dict[RunKey, Any], run: RunRecord) -> None:
    """A run record replaces whole, except the compactor's mark and the environment,
    which a ``None`` keeps (``merge_run``)."""
    key = (run.company_id, run.run_id)
    rows[key] = merge_run(rows.get(key), run)


class _IndexLine(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One line of ``deep-index.jsonl``; ``op`` says what happened to the run."""

    op: Literal["write", "prune", "forget"]
    company_id: str
    run_id: str
    rank: str = ""
    last_ts: str = ""
    received_at: str = ""
    at: str | None = None


def _fold_index(rows: dict[RunKey, Any], line: _IndexLine) -> None:
    key = (line.company_id, line.run_id)
    entry = rows.get(key)
    if line.op == "write":
        if entry is None or entry.pruned_at is None:  # a pruned run's bodies were refused
            rows[key] = fold_write(entry, key, line.last_ts, line.rank, line.received_at)
    elif line.op == "prune":
        if entry is None:
            rows[key] = IndexEntry(company_id=key[0], run_id=key[1], pruned_at=line.at)
        elif entry.pruned_at is None:
            entry.pruned_at = line.at
    elif entry is not None and entry.pruned_at is None:  # forget: a purge, which keeps tombstones
        del rows[key]


def rewrite_without(root: Path, name: str, drop: set[RunKey], fsync: bool) -> None:
    """Rewrite ``root/name`` without the lines of the runs in ``drop`` (temporary file,
    fsync, atomic ``os.replace``); call under the file's lock. A torn tail is dropped."""
    path = root / name
    if not path.exists():
        return
    tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for line in src:
            if not line.endswith(b"\n"):
                break
            try:
                key = _key_decoder.decode(line)
            except msgspec.DecodeError:
                continue
            if (key.company_id, key.run_id) not in drop:
                dst.write(line)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_directory(root)


def _fold_deep(rows: dict[RunKey, Any], deep: DeepRecord) -> None:
    run = rows.setdefault((deep.company_id, deep.run_id), {})
    run[deep.step_seq] = apply_deep(run.get(deep.step_seq), deep)


def fsync_directory(path: Path) -> None:
    """Make the directory's entries (a created or renamed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Directory:
    """The lock file and the append primitive shared by both file stores."""

    def __init__(self, root: Path, lock_name: str, fsync: bool) -> None:
        self.root = root
        self.fsync = fsync
        self._unsynced: set[str] = set()  # file names appended to but not yet synced
        self._lock_path = root / lock_name
        self.mutex = threading.Lock()  # this instance's threads; flock covers the rest

    @contextmanager
    def locked(self) -> Iterator[None]:
        with open(self._lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def append(self, writes: Sequence[tuple[str, bytes]]) -> None:
        """Append each ``(file name, lines)`` in order; with ``fsync``, every file
        written (and the directory, if a file was created) is synced before this
        returns. Call under :meth:`locked`.

        A file whose append or sync failed stays *unsynced* and is synced again by
        the next call, also one with nothing to write: the retry of a batch whose
        lines landed but did not sync finds its state stored and skips the run,
        and must still leave the lines on disk."""
        created = False
        self._unsynced.update(name for name, _ in writes)
        with ExitStack() as files:
            for name, data in writes:
                path = self.root / name
                created = created or not path.exists()
                f = files.enter_context(open(path, "a+b"))
                size = os.fstat(f.fileno()).st_size
                if size and os.pread(f.fileno(), 1, size - 1) != b"\n":
                    data = b"\n" + data  # a writer died mid-line: never glue onto its tail
                f.write(data)
                f.flush()
            if self.fsync:
                for name in sorted(self._unsynced):
                    with suppress(FileNotFoundError), open(self.root / name, "rb") as f:
                        os.fsync(f.fileno())
                if created:
                    fsync_directory(self.root)
        self._unsynced.clear()


def _lines(name: str, records: Sequence[Any]) -> bytes:
    try:
        return _encoder.encode_lines(records)
    except (ValueError, TypeError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        raise unstorable("file", name, exc) from None


def _as_sink_error(exc: OSError) -> SinkError:
    kind = SinkUnavailable if exc.errno in RETRIABLE_ERRNOS else SinkError
    return kind(f"file sink: {exc}")


class FileStepStore:
    """The step store over ``run-steps.jsonl``, ``runs.jsonl`` and ``run-state.jsonl``."""

    capabilities = CAPABILITIES

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self._dir = _Directory(root, "run-steps.lock", fsync)
        self.durability = _durability(fsync)
        self._steps = _Folded(root / STEPS_FILE, StepRecord, _fold_step)
        self._runs = _Folded(root / RUNS_FILE, RunRecord, _fold_run)
        self._states = _Folded(root / STATES_FILE, RunState, _fold_whole)

    async def write(
        self,
        steps: Sequence[StepRecord],
        runs: Sequence[RunRecord] = (),
        states: Sequence[RunState] = (),
    ) -> list[RunKey]:
        if not (steps or runs or states):
            return []
        return await asyncio.to_thread(self._append, steps, runs, states)

    def _append(
        self, steps: Sequence[StepRecord], runs: Sequence[RunRecord], states: Sequence[RunState]
    ) -> list[RunKey]:
        try:
            with self._dir.mutex, self._dir.locked():
                self._states.refresh()
                stored = self._states.rows
                batch = admit(steps, runs, states, {k: stored[k].last_seq for k in state_keys(states) if k in stored})
                # Every file's lines are encoded before the first byte is appended.
                writes = [  # steps, runs, then states: states last
                    (name, _lines(name, records))
                    for name, records in (
                        (STEPS_FILE, batch.steps),
                        (RUNS_FILE, batch.runs),
                        (STATES_FILE, batch.states),
                    )
                    if records
                ]
                self._dir.append(writes)
                return batch.skipped
        except OSError as exc:
            raise _as_sink_error(exc) from exc

    def _read(self, table: _Folded[Any], pick: Callable[[dict[RunKey, Any]], T]) -> T:
        with self._dir.mutex:
            try:
                table.refresh()
            except OSError as exc:
                raise _as_sink_error(exc) from exc
            return pick(table.rows)

    async def load_states(self, company_id: str, run_ids: Sequence[str]) -> dict[str, RunState]:
        def pick(rows: dict[RunKey, RunState]) -> dict[str, RunState]:
            return {r: rows[(company_id, r)] for r in run_ids if (company_id, r) in rows}

        return await asyncio.to_thread(self._read, self._states, pick)

    async def get_run(self, company_id: str, run_id: str) -> RunRecord | None:
        return await asyncio.to_thread(self._read, self._runs, lambda rows: rows.get((company_id, run_id)))

    async def list_runs(self, company_id: str, *, limit: int = 50, before: str | None = None) -> list[RunRecord]:
        return (await self.list_runs_page(company_id, limit=limit, before=before)).runs

    async def list_runs_page(
        self, company_id: str, *, limit: int = 50, before: str | None = None, where: RunFilter = NO_FILTER
    ) -> RunsPage:
        check_limit(limit)
        after = decode_cursor(before) if before is not None else None

        def pick(rows: dict[RunKey, RunRecord]) -> list[RunRecord]:
            return [
                r
                for (c, _), r in rows.items()
                if c == company_id and (after is None or run_sort_key(r) < after) and matches(r, where)
            ]

        runs = await asyncio.to_thread(self._read, self._runs, pick)
        runs.sort(key=run_sort_key, reverse=True)
        return RunsPage(*page(runs[: limit + 1], limit))

    async def get_steps(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[StepRecord]:
        def pick(rows: dict[RunKey, dict[int, StepRecord]]) -> list[StepRecord]:
            run = rows.get((company_id, run_id), {})
            return [run[seq] for seq in seq_range(run, after, limit)]

        return await asyncio.to_thread(self._read, self._steps, pick)

    async def list_companies(self) -> list[str]:
        return await asyncio.to_thread(self._read, self._runs, lambda rows: sorted({c for c, _ in rows}))

    async def mark_deep_pruned(self, company_id: str, run_ids: Sequence[str], at: str) -> int:
        def mark() -> int:
            try:
                with self._dir.mutex, self._dir.locked():
                    self._runs.refresh()
                    rows = self._runs.rows
                    marked = [
                        msgspec.structs.replace(rows[(company_id, r)], deep_pruned_at=at)
                        for r in dict.fromkeys(run_ids)
                        if (company_id, r) in rows and rows[(company_id, r)].deep_pruned_at is None
                    ]
                    if marked:
                        self._dir.append([(RUNS_FILE, _lines(RUNS_FILE, marked))])
                    return len(marked)
            except OSError as exc:
                raise _as_sink_error(exc) from exc

        return await asyncio.to_thread(mark)

    async def delete_runs(self, company_id: str, run_ids: Sequence[str]) -> int:
        drop = {(company_id, r) for r in run_ids}

        def delete() -> int:
            try:
                with self._dir.mutex, self._dir.locked():
                    self._runs.refresh()
                    gone = sum(key in self._runs.rows for key in drop)
                    for name in (STEPS_FILE, RUNS_FILE, STATES_FILE):
                        rewrite_without(self._dir.root, name, drop, self._dir.fsync)
                    for table in (self._steps, self._runs, self._states):
                        table.refresh()  # a new inode: folded again from the start
                    return gone
            except OSError as exc:
                raise _as_sink_error(exc) from exc

        return await asyncio.to_thread(delete) if drop else 0

    async def close(self) -> None:
        with self._dir.mutex:
            for table in (self._steps, self._runs, self._states):
                table.close()


class FileDeepStore:
    """The deep store over ``deep-trace.jsonl``."""

    capabilities = CAPABILITIES

    def __init__(
        self, root: Path, limits: Limits | None = None, *, fsync: bool = True, clock: Clock = time.time
    ) -> None:
        self._dir = _Directory(root, "deep-trace.lock", fsync)
        self.durability = _durability(fsync)
        self._deep = _Folded(root / DEEP_FILE, DeepRecord, _fold_deep)
        self._index = _Folded(root / INDEX_FILE, _IndexLine, _fold_index)
        self._limits = limits
        self.on_clip: ClipHook | None = None  # set by open_deep_store; counts clips at the port
        self._clock = clock

    @property
    def bad_lines(self) -> int:
        """Lines of ``deep-trace.jsonl`` that were not valid records (torn by a crash)."""
        return self._deep.bad_lines

    async def write(self, deeps: Sequence[DeepRecord]) -> None:
        if deeps:
            clipped = clip_batch(deeps, self._limits, self.on_clip)
            _lines(DEEP_FILE, clipped)  # refuse what cannot be encoded before taking the lock
            await asyncio.to_thread(self._append, clipped)

    def _pruned(self, key: RunKey) -> bool:
        entry = self._index.rows.get(key)
        return entry is not None and entry.pruned_at is not None

    def _append(self, clipped: list[DeepRecord]) -> None:
        received = now_text(self._clock)
        try:
            with self._dir.mutex, self._dir.locked():
                # Under the lock: the tombstone check, the index line and the bodies are one step.
                self._index.refresh()
                kept = [d for d in clipped if not self._pruned((d.company_id, d.run_id))]
                if not kept:
                    return
                index = [
                    _IndexLine(op="write", company_id=c, run_id=r, rank=rank, last_ts=last, received_at=received)
                    for (c, r), (last, rank) in batch_ranks(kept, received).items()
                ]
                self._dir.append([(INDEX_FILE, _lines(INDEX_FILE, index)), (DEEP_FILE, _lines(DEEP_FILE, kept))])
        except OSError as exc:
            raise _as_sink_error(exc) from exc

    def _read(self, pick: Callable[[dict[RunKey, dict[int, DeepRecord]]], T]) -> T:
        with self._dir.mutex:
            try:
                self._index.refresh()
                self._deep.refresh()
            except OSError as exc:
                raise _as_sink_error(exc) from exc
            return pick(self._deep.rows)

    async def get_deep(
        self, company_id: str, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[DeepRecord]:
        def pick(rows: dict[RunKey, dict[int, DeepRecord]]) -> list[DeepRecord]:
            if self._pruned((company_id, run_id)):
                return []
            run = rows.get((company_id, run_id), {})
            return [run[seq] for seq in seq_range(run, after, limit)]

        return await asyncio.to_thread(self._read, pick)

    async def list_deep_runs(self, company_id: str) -> list[tuple[str, str]]:
        def pick(rows: dict[RunKey, dict[int, DeepRecord]]) -> list[tuple[str, str]]:
            return [(r, ts) for r, ts in _deep_runs(rows, company_id) if not self._pruned((company_id, r))]

        return await asyncio.to_thread(self._read, pick)

    async def purge_run(self, company_id: str, run_id: str) -> int:
        dropped = await asyncio.to_thread(
            self._drop,
            lambda rows: [(company_id, run_id)] if (company_id, run_id) in rows else [],
            lambda key: key == (company_id, run_id),
        )
        return sum(dropped.values())

    async def purge_company(self, company_id: str) -> int:
        dropped = await asyncio.to_thread(
            self._drop, lambda rows: [k for k in rows if k[0] == company_id], lambda key: key[0] == company_id
        )
        return sum(dropped.values())

    async def prune(self, company_id: str, keep: int) -> list[str]:
        check_keep(keep)
        return await prune_via_marks(self, company_id, keep, now_text(self._clock))

    async def list_companies(self) -> list[str]:
        def pick(rows: dict[RunKey, dict[int, DeepRecord]]) -> list[str]:
            return sorted({c for c, _ in self._index.rows} | {c for (c, _), run in rows.items() if run})

        return await asyncio.to_thread(self._read, pick)

    async def retention_index(self, company_id: str) -> list[DeepRun]:
        def pick(rows: dict[RunKey, dict[int, DeepRecord]]) -> list[DeepRun]:
            entries = {r: e for (c, r), e in self._index.rows.items() if c == company_id}
            bodies = {r: (len(run), max(d.ts for d in run.values())) for (c, r), run in rows.items() if c == company_id and run}
            return merge_index(entries, bodies)

        return await asyncio.to_thread(self._read, pick)

    async def mark_pruned(self, company_id: str, runs: Sequence[tuple[str, int]], at: str) -> list[str]:
        def mark() -> list[str]:
            try:
                with self._dir.mutex, self._dir.locked():
                    self._index.refresh()
                    entries = self._index.rows
                    marked = []
                    for run_id, version in runs:
                        entry = entries.get((company_id, run_id))
                        if (entry is None and version == 0) or (
                            entry is not None and entry.pruned_at is None and entry.version == version
                        ):
                            marked.append(run_id)
                    if marked:
                        lines = [_IndexLine(op="prune", company_id=company_id, run_id=r, at=at) for r in marked]
                        self._dir.append([(INDEX_FILE, _lines(INDEX_FILE, lines))])
                    return marked
            except OSError as exc:
                raise _as_sink_error(exc) from exc

        return await asyncio.to_thread(mark) if runs else []

    async def delete_pruned(self, company_id: str, run_ids: Sequence[str]) -> int:
        wanted = {(company_id, r) for r in run_ids}

        def choose(rows: dict[RunKey, dict[int, DeepRecord]]) -> list[RunKey]:
            return [k for k in rows if k in wanted and self._pruned(k)]

        dropped = await asyncio.to_thread(self._drop, choose) if wanted else {}
        return sum(dropped.values())

    def _drop(
        self,
        choose: Callable[[dict[RunKey, dict[int, DeepRecord]]], list[RunKey]],
        forget: Callable[[RunKey], bool] | None = None,
    ) -> dict[RunKey, int]:
        """Under the lock: fold to the end, pick the runs, rewrite the file without them
        (and, for a purge, forget the index entries ``forget`` names unless they are
        marked pruned).
        Returns ``{run key: rows removed}`` in the order chosen."""
        try:
            with self._dir.mutex, self._dir.locked():
                self._index.refresh()
                self._deep.refresh()
                rows = self._deep.rows
                keys = choose(rows)
                forgotten = [] if forget is None else [k for k in self._index.rows if forget(k) and not self._pruned(k)]
                dropped = {key: len(rows[key]) for key in keys}
                if dropped:
                    self._rewrite_without(set(keys))
                    self._deep.adopt({k: v for k, v in rows.items() if k not in dropped})
                if forgotten:
                    lines = [_IndexLine(op="forget", company_id=c, run_id=r) for c, r in forgotten]
                    self._dir.append([(INDEX_FILE, _lines(INDEX_FILE, lines))])
                return dropped
        except OSError as exc:
            raise _as_sink_error(exc) from exc

    def _rewrite_without(self, drop: set[RunKey]) -> None:
        rewrite_without(self._dir.root, DEEP_FILE, drop, self._dir.fsync)

    async def close(self) -> None:
        with self._dir.mutex:
            self._deep.close()
            self._index.close()


def _deep_runs(rows: dict[RunKey, dict[int, DeepRecord]], company_id: str) -> list[tuple[str, str]]:
    return newest_first({r: max(d.ts for d in run.values()) for (c, r), run in rows.items() if c == company_id and run})


def _durability(fsync: bool) -> str:
    return "fsync" if fsync else "no fsync"


def open_directory(path: str, *, fsync: bool = True) -> Path:
    """The store directory, created if missing (durably, with ``fsync``)."""
    root = Path(path)
    try:
        if not root.is_dir():
            root.mkdir(parents=True, exist_ok=True)
            if fsync:
                fsync_directory(root.resolve().parent)
    except OSError as exc:
        raise _as_sink_error(exc) from exc
    return root
