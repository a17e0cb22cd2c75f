"""``stepstream ingest-file``: the worker's pipeline over a JSON-lines file, no Kafka.

Every line is decoded with the same decoder as the worker; a bad line is reported
with its line number on stderr and written to the rejects file (one JSON object per
rejected line: ``line``, ``reason``, ``detail``, ``raw``), never dropped silently.
At the end every pending thinking tail is flushed as an idle timeout would flush
it, so the records equal those of a worker that consumed the same events.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO

import msgspec
from tqdm import tqdm

from stepstream.core.fold import Limits
from stepstream.core.redact import TEXT_CHARS, scrub
from stepstream.core.wire import decode_event
from stepstream.errors import WireError
from stepstream.metrics import Metrics
from stepstream.pipeline import BATCH_BYTES, Pipeline
from stepstream.sinks import open_deep_store, open_step_store


class IngestReport(msgspec.Struct):
    lines: int = 0
    events: int = 0
    rejected: int = 0
    batches: int = 0


async def ingest_file(
    path: Path,
    steps_url: str,
    deep_url: str,
    *,
    rejects: Path | None = None,
    max_event_bytes: int = 1_048_576,
    batch_bytes: int = BATCH_BYTES,
    limits: Limits | None = None,
    progress: bool = True,
    stderr: IO[str] | None = None,
    metrics: Metrics | None = None,
) -> IngestReport:
    """Ingest ``path`` into the two sinks; returns counts. Blank lines are skipped."""
    report = IngestReport()
    stderr = stderr if stderr is not None else sys.stderr
    steps = await open_step_store(steps_url)
    deep = await open_deep_store(deep_url)
    reject_out = None
    try:
        pipeline = Pipeline(steps, deep, limits=limits, metrics=metrics, batch_records=5000, batch_seconds=3600,
                            batch_bytes=batch_bytes)  # fmt: skip
        total = path.stat().st_size
        with path.open("rb") as fh, tqdm(
            total=total, unit="B", unit_scale=True, desc="ingest", file=stderr, disable=not progress, mininterval=0.5
        ) as bar:
            for number, line in enumerate(fh, start=1):
                bar.update(len(line))
                report.lines = number
                body = line.rstrip(b"\r\n")
                if not body.strip():
                    continue
                try:
                    event = decode_event(body, max_bytes=max_event_bytes)
                    await pipeline.push(event, size=len(body))
                    report.events += 1
                except WireError as exc:
                    report.rejected += 1
                    detail = scrub(exc.detail, TEXT_CHARS)
                    if reject_out is None:
                        reject_path = rejects or path.with_name(path.name + ".rejects.jsonl")
                        reject_out = reject_path.open("wb")
                        print(f"rejects go to {reject_path}", file=stderr)
                    print(f"line {number}: {exc.reason}: {detail}", file=stderr)
                    reject_out.write(
                        msgspec.json.encode(
                            {"line": number, "reason": exc.reason, "detail": detail, "raw": body.decode("utf-8", "replace")}
                        )
                        + b"\n"
                    )
            await pipeline.drain()
        report.batches = pipeline.written_batches
    finally:
        if reject_out is not None:
            reject_out.close()
        await steps.close()
        if deep is not steps:
            await deep.close()
    return report
