"""``stepstream demo``: emit realistic agent runs (several companies, thinking bursts,
tool calls with secrets in their arguments, large outputs, failures) to the topic,
through the producer SDK exactly as an agent would.

The corpus (:mod:`stepstream.emitter.corpus`) decides what each run does and how the
runs interleave; each of its events becomes one SDK call on that run's
:class:`~stepstream.emitter.run.Run`, so the SDK assigns ``event_id``, ``seq`` and
``ts``. A corpus run without ``run_end`` (a dead agent) is left open.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO

import msgspec

from stepstream.config import Settings
from stepstream.core import wire
from stepstream.emitter.corpus import generate_events
from stepstream.emitter.run import Run
from stepstream.emitter.tracer import Tracer


def replay_on(tracer: Tracer, events: list[wire.Event]) -> int:
    """Make each corpus event an SDK call on its run; returns how many calls were made."""
    runs: dict[tuple[str, str], Run] = {}
    calls = 0
    for event in events:
        key = (event.company_id, event.run_id)
        payload = event.payload
        if isinstance(event, wire.RunStart):
            run = tracer.run(
                event.company_id, event.run_id, agent_name=payload.agent_name,
                environment=payload.environment, metadata=payload.metadata,
            )  # fmt: skip
            runs[key] = run
            run.start()
        else:
            _call(runs[key], event)
        calls += 1
    return calls


def _call(run: Run, event: wire.Event) -> None:
    p: object = event.payload
    if isinstance(p, wire.LlmRequestPayload):
        run.llm_request(p.call_id, provider=p.provider, model=p.model, input=p.input, params=p.params)
    elif isinstance(p, wire.LlmResponsePayload):
        usage = msgspec.to_builtins(p.usage) if p.usage is not None else None
        run.llm_response(p.call_id, p.output, usage=usage, stop_reason=p.stop_reason)
    elif isinstance(p, wire.ThinkingDeltaPayload):
        run.thinking(p.text)
    elif isinstance(p, wire.ToolCallPayload):
        run.tool_call(p.call_id, p.tool, p.arguments)
    elif isinstance(p, wire.ToolResultPayload):
        run.tool_result(p.call_id, p.output, is_error=bool(p.is_error))
    elif isinstance(p, wire.StateChangePayload):
        run.state_change(p.key, p.value)
    elif isinstance(p, wire.ErrorPayload):
        run.error(p.message, kind=p.kind)
    elif isinstance(p, wire.RunEndPayload):
        run.end(p.status, p.failure)
    else:  # a new event type the demo does not know yet
        raise TypeError(f"demo: no SDK call for {type(p).__name__}")


async def run_demo(settings: Settings, *, runs: int, companies: int, seed: int, out: Path | None = None) -> int:
    from stepstream.kafka.preflight import preflight
    from stepstream.kafka.topics import ensure_topics

    await preflight(settings.kafka, topics=(settings.topic,))
    if settings.create_topics:  # an agent principal may only WRITE the raw topic: --no-create-topics
        await ensure_topics(settings)
    events = generate_events(seed, runs=runs, companies=companies)
    sink: IO[bytes] | None = out.open("wb") if out is not None else None
    tee = (lambda value: sink.write(value + b"\n")) if sink is not None else None
    started = time.perf_counter()
    try:
        # The queue holds the whole demo: it is emitted at once, not at an agent's pace.
        async with Tracer(settings.kafka, settings.topic, max_queue=len(events) + 1, flush_timeout=120, tee=tee) as tracer:
            replay_on(tracer, events)
        stats = tracer.stats()
    finally:
        if sink is not None:
            sink.close()
    took = time.perf_counter() - started
    print(
        f"demo: sent {stats.sent} events of {runs} runs across {companies} companies to "
        f"{settings.topic} at {settings.broker} in {took:.1f}s ({stats.dropped} dropped, {stats.failed} failed)",
        file=sys.stderr,
    )
    return 0 if stats.dropped == 0 and stats.failed == 0 else 1
