"""A faust agent that does nothing but ack: faust's own per-message ceiling on this
machine, run as a subprocess by ``bench_worker``.

    python -m benchmarks.faust_noop BROKER TOPIC COUNT RESULT_FILE
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import faust

from benchmarks.worker_process import runqueue_seconds


def main() -> None:
    broker, topic, count, result = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    app = faust.App(
        f"bench-noop-{uuid.uuid4().hex[:6]}", broker=f"kafka://{broker}", key_serializer="raw", value_serializer="raw",
        store="memory://", topic_allow_declare=False, topic_disable_leader=True, consumer_auto_offset_reset="earliest",
        web_enabled=False, stream_wait_empty=False,
    )
    source = app.topic(topic, key_type=bytes, value_type=bytes)
    seen = {"n": 0, "t0": 0.0, "c0": 0.0, "q0": 0.0}

    @app.agent(source)
    async def noop(stream: faust.StreamT) -> None:
        async for event in stream.noack().events():
            if seen["n"] == 0:
                seen["t0"], seen["c0"], seen["q0"] = time.perf_counter(), time.process_time(), runqueue_seconds(os.getpid())
            seen["n"] += 1
            event.ack()
            if seen["n"] >= count:
                took = time.perf_counter() - seen["t0"]
                cpu = time.process_time() - seen["c0"]
                runqueue = runqueue_seconds(os.getpid()) - seen["q0"]
                with open(result, "w") as fh:
                    json.dump({"seconds": took, "cpu": cpu, "runqueue": runqueue, "events": count}, fh)
                os._exit(0)  # faust's shutdown is slow and irrelevant here

    faust.Worker(app, loglevel="ERROR", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main()
