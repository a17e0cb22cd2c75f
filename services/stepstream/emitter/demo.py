"""``stepstream demo``: emit realistic agent runs (several companies, thinking bursts,
tool calls with secrets in their arguments, large outputs, failures) to the topic."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from stepstream.config import Settings
from stepstream.core.wire import encode_event
from stepstream.emitter.corpus import generate_events
from stepstream.emitter.producer import Emitter


async def run_demo(settings: Settings, *, runs: int, companies: int, seed: int, out: Path | None = None) -> int:
    from stepstream.ingest.app import ensure_topics

    await ensure_topics(settings)
    events = generate_events(seed, runs=runs, companies=companies)
    if out is not None:
        out.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    started = time.perf_counter()
    async with Emitter(settings.broker, settings.topic) as emitter:
        sent = await emitter.emit_many(events)
    took = time.perf_counter() - started
    print(
        f"demo: sent {sent} events of {runs} runs across {companies} companies to "
        f"{settings.topic} at {settings.broker} in {took:.1f}s",
        file=sys.stderr,
    )
    return 0
