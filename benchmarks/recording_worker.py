"""The worker's write path into a MongoDB-wire store, with every command it sends recorded.

    recording = await record_ingest(events_file, "mongodb://127.0.0.1:P/db")
    recording.writes        # the write commands, in the order sent: what a bare loop replays
    recording.reads         # the reads the sink did before (or between) its writes

It runs ``stepstream.ingest.offline.ingest_file``: the worker's pipeline (decode,
fold, group commit of up to 5,000 records, the state loads per chunk, the MongoDB
sink for steps and deep rows) without Kafka or faust. A pymongo
``CommandListener`` (registered once per process: pymongo's listeners are global)
copies every command sent to the recording's database as BSON bytes, so later
mutation of a document by the caller cannot change what was recorded. A write
command is ``insert``, ``update`` or ``delete``: its statements (the documents,
or the ``{q, u, upsert, multi}`` / ``{q, limit}`` entries), its ``ordered`` flag and
its ``writeConcern`` are kept whole; anything else (``find``, ``getMore``,
``aggregate``, ``count``, ``distinct``) is a read, counted with its bytes and
those of its reply.
Set-up commands (``createIndexes``, ``buildInfo``, handshakes, ``endSessions``,
``dropDatabase``) are neither.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import bson
from pymongo import monitoring

from stepstream.ingest.offline import ingest_file

WRITE_COMMANDS = {"insert": "documents", "update": "updates", "delete": "deletes"}
SETUP_COMMANDS = frozenset(
    {"buildInfo", "createIndexes", "dropDatabase", "endSessions", "hello", "isMaster", "ismaster", "ping",
     "listIndexes", "listCollections", "saslStart", "saslContinue", "killCursors"}
)  # fmt: skip


@dataclass
class WriteCommand:
    """One write command as sent: ``kind`` is ``insert``, ``update`` or ``delete``."""

    kind: str
    collection: str
    statements: list[dict[str, Any]]
    ordered: bool
    write_concern: dict[str, Any] | None
    bytes: int


@dataclass
class Recording:
    """What one pass sent to its database, in order, with its clock."""

    database: str
    writes: list[WriteCommand] = field(default_factory=list)
    reads: dict[str, int] = field(default_factory=dict)  # command name -> count
    read_bytes: int = 0
    read_statements: int = 0
    reply_bytes: int = 0  # what the reads' replies carried back (the documents found)
    events: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    _reads: set[int] = field(default_factory=set)

    @property
    def write_statements(self) -> int:
        return sum(len(w.statements) for w in self.writes)

    @property
    def write_bytes(self) -> int:
        return sum(w.bytes for w in self.writes)

    @property
    def commands(self) -> int:
        return len(self.writes) + sum(self.reads.values())

    def write_concern(self) -> dict[str, Any] | None:
        """The write concern the writes carried (the first one's; they all share the
        database's), ``None`` when they carried none (the server's default)."""
        return self.writes[0].write_concern if self.writes else None

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.database_name != self.database or event.command_name in SETUP_COMMANDS:
            return
        raw = bson.encode(event.command)
        name = event.command_name
        if name in WRITE_COMMANDS:
            command = bson.decode(raw)
            self.writes.append(
                WriteCommand(
                    kind=name,
                    collection=command[name],
                    statements=list(command.get(WRITE_COMMANDS[name]) or []),
                    ordered=bool(command.get("ordered", True)),
                    write_concern=command.get("writeConcern"),
                    bytes=len(raw),
                )
            )
        else:
            self.reads[name] = self.reads.get(name, 0) + 1
            self.read_statements += 1
            self.read_bytes += len(raw)
            self._reads.add(event.request_id)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.request_id in self._reads:
            self._reads.discard(event.request_id)
            self.reply_bytes += len(bson.encode(event.reply))


_active: list[Recording] = []  # the recording the one registered listener feeds, if any


class _Forward(monitoring.CommandListener):
    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if _active:
            _active[0].started(event)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if _active:
            _active[0].succeeded(event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


_registered: list[_Forward] = []


def _register() -> None:
    """pymongo's listeners are process-wide and cannot be removed: one, once, which
    forwards to the recording in progress (none: it returns at once)."""
    if not _registered:
        _registered.append(_Forward())
        monitoring.register(_registered[0])


def database_of(url: str) -> str:
    return urlsplit(url).path.lstrip("/") or "stepstream"


async def record_ingest(events_file: Path, url: str, *, events: int) -> Recording:
    """Ingest ``events_file`` (``events`` lines) into ``url`` (steps and deep rows) the
    worker's way, recording what it sends, and timing it (wall and this process's CPU;
    the recording's copying is included, so time a second pass without it)."""
    _register()
    recording = Recording(database_of(url), events=events)
    _active[:] = [recording]
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        report = await ingest_file(events_file, url, url, progress=False)
        recording.seconds, recording.cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        _active.clear()
    if report.rejected or report.events != events:
        raise RuntimeError(f"ingest of {events_file} applied {report.events} of {events} events, rejected {report.rejected}")
    return recording


async def timed_ingest(events_file: Path, url: str, *, events: int) -> Recording:
    """The same ingest, nothing recorded: the worker's events/s and CPU."""
    recording = Recording(database_of(url), events=events)
    cpu, wall = time.process_time(), time.perf_counter()
    report = await ingest_file(events_file, url, url, progress=False)
    recording.seconds, recording.cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    if report.rejected or report.events != events:
        raise RuntimeError(f"ingest of {events_file} applied {report.events} of {events} events, rejected {report.rejected}")
    return recording
