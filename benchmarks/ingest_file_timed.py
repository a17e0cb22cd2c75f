"""``stepstream ingest-file`` timed from inside its process, run as a subprocess by
``bench_worker``: the CLI's own code path, with the interpreter start and imports
left out (as the worker's figures leave out its startup).

    python -m benchmarks.ingest_file_timed EVENTS.jsonl SINK_URL RESULT_FILE
"""

from __future__ import annotations

import os
import sys
import time

import msgspec

from benchmarks.worker_process import runqueue_seconds


def main() -> None:
    events, sink, result = sys.argv[1:4]
    import stepstream.ingest.offline  # noqa: F401 - imported before the clock starts
    from stepstream.cli import main as cli

    started, cpu0, queued0 = time.perf_counter(), time.process_time(), runqueue_seconds(os.getpid())
    code = cli(["ingest-file", events, "--steps-sink", sink, "--no-progress"])
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu0
    runqueue = runqueue_seconds(os.getpid()) - queued0  # the aiosqlite thread has exited by now
    with open(result, "wb") as fh:
        fh.write(msgspec.json.encode({"seconds": seconds, "cpu": cpu, "runqueue": runqueue, "exit": code}))


if __name__ == "__main__":
    main()
