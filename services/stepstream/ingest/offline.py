"""``stepstream ingest-file``: the worker's pipeline over a JSON-lines file, no Kafka.

It runs on the worker's machinery: the file is read in chunks (:data:`CHUNK_BYTES`,
at most :data:`CHUNK_LINES` lines), every line of a chunk is decoded with the same
decoder as the worker, the durable states of the chunk's runs are loaded in one
store query per company (as the worker loads a fetch's), and the events are applied
to the same :class:`~stepstream.pipeline.Pipeline`, with the worker's group commit:
a full batch is written in the background (the SQLite sink's writer process) while
the next chunk is read, decoded and folded.

A bad line is reported with its line number on stderr and written to the rejects
file (one JSON object per rejected line, in line order: ``line``, ``reason``,
``detail``, ``raw``), never dropped silently. At the end every pending thinking tail
is flushed as an idle timeout would flush it, so the records equal those of a worker
that consumed the same events.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec
from tqdm import tqdm

from stepstream.core.fold import Limits
from stepstream.core.redact import TEXT_CHARS, scrub
from stepstream.core.wire import decode_event
from stepstream.errors import WireError
from stepstream.metrics import Metrics
from stepstream.pipeline import BATCH_BYTES, NotLoaded, Pipeline
from stepstream.sinks import open_stores


#: A chunk is read until it holds this many bytes of lines (the last line whole) ...
CHUNK_BYTES = 4 * 1024 * 1024
#: ... or this many lines: one state load (per company) for all of its runs.
CHUNK_LINES = 5000


class IngestReport(msgspec.Struct):
    lines: int = 0
    events: int = 0
    rejected: int = 0
    batches: int = 0


def read_chunks(fh: IO[bytes]) -> Iterator[list[bytes]]:
    """The file's lines (each with its line ending) in chunks of about
    :data:`CHUNK_BYTES`, at most :data:`CHUNK_LINES` lines each."""
    chunk: list[bytes] = []
    size = 0
    for line in fh:
        chunk.append(line)
        size += len(line)
        if size >= CHUNK_BYTES or len(chunk) >= CHUNK_LINES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _Rejects:
    """The rejects file, opened at the first rejected line; each also goes to stderr."""

    def __init__(self, path: Path, stderr: IO[str]) -> None:
        self.path = path
        self._stderr = stderr
        self._out: IO[bytes] | None = None

    def add(self, number: int, reason: str, detail: str, body: bytes) -> None:
        detail = scrub(detail, TEXT_CHARS)
        if self._out is None:
            self._out = self.path.open("wb")
            print(f"rejects go to {self.path}", file=self._stderr)
        print(f"line {number}: {reason}: {detail}", file=self._stderr)
        record = {"line": number, "reason": reason, "detail": detail, "raw": body.decode("utf-8", "replace")}
        self._out.write(msgspec.json.encode(record) + b"\n")

    def close(self) -> None:
        if self._out is not None:
            self._out.close()


async def ingest_file(
    path: Path,
    steps_url: str,
    deep_url: str,
    *,
    rejects: Path | None = None,
    max_event_bytes: int = 1_048_576,
    batch_records: int = 5000,
    batch_bytes: int = BATCH_BYTES,
    limits: Limits | None = None,
    progress: bool = True,
    stderr: IO[str] | None = None,
    metrics: Metrics | None = None,
) -> IngestReport:
    """Ingest ``path`` into the two sinks; returns counts. Blank lines are skipped.
    Raises :class:`~stepstream.pipeline.StoreFailed` when the stores fail under the
    worker's fault policy (what was written stays; a second run of the same file
    skips the events already applied, as duplicates)."""
    report = IngestReport()
    stderr = stderr if stderr is not None else sys.stderr
    steps, deep = await open_stores(steps_url, deep_url)
    bad = _Rejects(rejects or path.with_name(path.name + ".rejects.jsonl"), stderr)
    try:
        # No batch timer here: a batch is written when it is full (group commit, as the
        # worker's) and at the end; nothing waits on a clock.
        pipeline = Pipeline(steps, deep, limits=limits, metrics=metrics, batch_records=batch_records,
                            batch_seconds=3600, batch_bytes=batch_bytes)  # fmt: skip
        total = path.stat().st_size
        with path.open("rb") as fh, tqdm(
            total=total, unit="B", unit_scale=True, desc="ingest", file=stderr, disable=not progress, mininterval=0.5
        ) as bar:
            number = 0
            for chunk in read_chunks(fh):
                # Decoded first, so the chunk's runs are loaded in one wait.
                decoded: list[tuple[int, bytes, Any]] = []
                read = 0
                for line in chunk:
                    number += 1
                    read += len(line)
                    body = line.rstrip(b"\r\n")
                    if not body.strip():
                        continue
                    try:
                        decoded.append((number, body, decode_event(body, max_bytes=max_event_bytes)))
                    except WireError as exc:
                        decoded.append((number, body, exc))
                await pipeline.load(
                    (item.company_id, item.run_id) for _, _, item in decoded if not isinstance(item, WireError)
                )
                for line_number, body, item in decoded:
                    if isinstance(item, WireError):
                        report.rejected += 1
                        bad.add(line_number, item.reason, item.detail, body)
                        continue
                    try:
                        try:
                            full = pipeline.apply(item, size=len(body))
                        except NotLoaded as missing:
                            # The run left memory since the chunk was loaded (it ended and
                            # its batch was written): read its state again.
                            await pipeline.load((missing.key,))
                            full = pipeline.apply(item, size=len(body))
                    except WireError as exc:  # the fold refused it: nothing changed
                        report.rejected += 1
                        bad.add(line_number, exc.reason, exc.detail, body)
                        continue
                    report.events += 1
                    if full:
                        await pipeline.flush(wait=False)
                pipeline.unstage()
                report.lines = number
                bar.update(read)
            await pipeline.drain()
        report.batches = pipeline.written_batches
    finally:
        bad.close()
        await steps.close()
        if deep is not steps:
            await deep.close()
    return report
