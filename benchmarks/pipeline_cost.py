"""The fold-and-batch path alone: ``Pipeline.push`` of a corpus into memory stores.

Prints CPU microseconds per event (``time.process_time``) for each round. Under
``benchmarks/pipeline_instructions.sh`` the same loop is counted in instructions by
callgrind, which a loaded machine does not change: the way to compare two trees of
the pipeline on a shared machine (run it once per tree, ``PYTHONPATH`` picking it).

    python -m benchmarks.pipeline_cost write CORPUS {thinking-heavy|many-runs} [EVENTS]
    python -m benchmarks.pipeline_cost run CORPUS ROUNDS
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import time

import msgspec

import stepstream.cli  # noqa: F401  (the import order the CLI has)
from stepstream.core.wire import decode_event, encode_event
from stepstream.emitter.corpus import generate_events, generate_many_runs
from stepstream.pipeline import Pipeline
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore


def write(path: str, name: str, events: int) -> None:
    if name == "thinking-heavy":
        out: list[object] = []
        seed = 1
        while len(out) < events:
            out.extend(generate_events(seed, runs=200, companies=5))
            seed += 1
    elif name == "many-runs":
        out = list(generate_many_runs(1, runs=max(1, events // 9), companies=8))
    else:
        raise SystemExit(f"unknown corpus {name!r}")
    blobs = [encode_event(e) for e in out[:events]]
    with open(path, "wb") as f:
        f.write(msgspec.msgpack.encode(blobs))
    print(f"{path}: {len(blobs)} events of {name}")


async def run(path: str, rounds: int) -> None:
    with open(path, "rb") as f:
        blobs = msgspec.msgpack.decode(f.read())
    events = [decode_event(b) for b in blobs]
    for _ in range(rounds):
        pipeline = Pipeline(MemoryStepStore(), MemoryDeepStore())
        sized = "size" in inspect.signature(pipeline.push).parameters  # trees before batch_bytes
        started = time.process_time()
        for i, (event, blob) in enumerate(zip(events, blobs)):
            if sized:
                await pipeline.push(event, ("t", 0), i, len(blob))
            else:
                await pipeline.push(event, ("t", 0), i)
        await pipeline.flush()
        print(f"{(time.process_time() - started) / len(events) * 1e6:.2f} us/event", file=sys.stderr)


def main(argv: list[str]) -> None:
    if len(argv) >= 3 and argv[0] == "write":
        write(argv[1], argv[2], int(argv[3]) if len(argv) > 3 else 20_000)
    elif len(argv) == 3 and argv[0] == "run":
        asyncio.run(run(argv[1], int(argv[2])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
