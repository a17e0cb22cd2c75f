"""Long fault runs, only in `make soak` (marker `soak`): many more SIGKILLs over a
bigger corpus, with a second worker coming and going, compared with ingest-file."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from harness import Scenario, dump, first_difference, wait_caught_up
from stepstream.core.wire import encode_event
from stepstream.emitter.corpus import generate_events
from stepstream.ingest.offline import ingest_file

pytestmark = [pytest.mark.integration, pytest.mark.soak]

KILLS = int(os.environ.get("SOAK_KILLS", "40"))
RUNS = int(os.environ.get("SOAK_RUNS", "1000"))


async def test_many_kills_and_a_flapping_second_worker_converge(kafka_bootstrap, tmp_path):
    events = generate_events(424242, runs=RUNS, companies=8, duplicates=0.02, redeliveries=3)
    companies = sorted({e.company_id for e in events})
    src = tmp_path / "events.jsonl"
    src.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    golden_url = f"sqlite:///{tmp_path / 'golden.db'}"
    await ingest_file(src, golden_url, golden_url, progress=False)
    golden = await dump(golden_url, golden_url, companies)

    scenario = Scenario(kafka_bootstrap, tmp_path, partitions=6)
    await scenario.create_topics()
    rng = random.Random(77)
    chunk = len(events) // KILLS + 1
    main = scenario.start_worker(name="m0")
    extra = None
    try:
        for i, start in enumerate(range(0, len(events), chunk)):
            await scenario.produce(events[start : start + chunk])
            await asyncio.sleep(rng.uniform(0.2, 3.0))
            if rng.random() < 0.3:
                if extra is None:
                    extra = scenario.start_worker(name=f"x{i}")
                else:
                    extra.kill() if rng.random() < 0.5 else extra.stop()
                    extra = None
            main.kill()
            main = scenario.start_worker(name=f"m{i + 1}")
        if extra is not None:
            extra.stop()
        await wait_caught_up(scenario.broker, scenario.group, scenario.topic, [main], timeout=900)
        main.stop()
    finally:
        scenario.stop_all()
    stops = sorted(round(w.stop_seconds, 1) for w in scenario.workers if w.stop_seconds is not None)
    hung = [w.log_path.name for w in scenario.workers if w.stop_timed_out]
    print(f"soak: SIGTERM to exit (s): {stops}; SIGKILLed after SIGTERM: {hung}")
    # The stop grace (15 s) bounds a stop that waits on a rebalance (which here waits
    # for the 60 s sessions of the killed workers): the harness's 30 s are never needed.
    got = await dump(scenario.steps_url, scenario.deep_url, companies)
    print(f"soak: {len(events)} events, {RUNS} runs, {KILLS} kills: {'converged' if got == golden else 'DIVERGED'}")
    assert got == golden, first_difference(golden, got)
    assert not hung, f"no exit within 30 s of SIGTERM: {hung}"
