"""Where the worker's CPU goes, per corpus, every process counted: the pipeline of
``stepstream worker`` (decode, fold, batch, ship to the writers) over a corpus into
SQLite (the default: the step store and the deep store in one file, each with its own
writer process), without Kafka, so each part can be timed on its own.

    python -m benchmarks.worker_profile CORPUS [--profile]
    (a corpus: python -m benchmarks.pipeline_cost write /tmp/th20.bin thinking-heavy 20000)

Prints, per event: CPU microseconds of this process and of each writer process (from
``/proc``), the rows each store upserts and the bytes of the requests sent to the
writers, and the bytes each writer process wrote (``/proc/PID/io`` ``wchar``: the WAL
and its checkpoints, plus its few reply bytes). With ``--profile`` both sides run
under cProfile (this process in place, each writer as ``python -m cProfile``) and the
time is split into the named parts (``PARTS``, inclusive times of the functions that
own each part; a profiler slows Python code more than C code, so read the shares, not
the absolute figures). The bare loop over Kafka and faust's consumer thread are not
here: ``make bench`` measures the whole worker beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

import stepstream.cli  # noqa: F401  (the import order the CLI has)
from stepstream import collector
from stepstream.core.wire import decode_event
from stepstream.pipeline import Pipeline
from stepstream.sinks import sqlite_writer
from stepstream.sinks.sqlite import SqliteDeepStore, SqliteStepStore

FETCH = 1000  # events per fetch (the worker's are what aiokafka returns; about this many under load)

# (part, where the function is, its name): the inclusive time of each. In this process:
MAIN_PARTS: tuple[tuple[str, str, Any], ...] = (
    ("decode (msgspec)", "", "decode_event"),
    ("fold (RunFold.push, redaction and caps included)", "core/fold.py", "push"),
    ("  of which redaction", "core/redact.py", "redact"),
    ("batch rows (RowBatch.add, merge)", "pipeline/batch.py", "add"),
    ("seal (lazy folds -> states)", "pipeline/batch.py", "seal"),
    ("request to the writers (MessagePack)", "sinks/sqlite_writer.py", "request"),
)
# ... and in a writer process:
WRITER_PARTS: tuple[tuple[str, str, Any], ...] = (
    ("decode the request (MessagePack)", "~", "<method 'decode' of 'msgspec.msgpack.Decoder' objects>"),
    ("stale-run check (SELECT last_seq)", "sinks/sqlite_operations.py", "_stored_last_seq"),
    ("parameter rows: steps", "sinks/sqlite_operations.py", "step_params"),
    ("parameter rows: runs", "sinks/sqlite_operations.py", "run_params"),
    ("parameter rows: states (JSON)", "sinks/sqlite_operations.py", "state_params"),
    ("parameter rows: deep (clip + JSON)", "sinks/sqlite_operations.py", ("deep_params", "clipped_deep_params")),
    ("SQL upserts (executemany)", "~", "<method 'executemany' of 'sqlite3.Connection' objects>"),
    ("  of which the reasoning splice", "core/merge.py", "apply_reasoning"),
    ("BEGIN / COMMIT and other statements", "~", "<method 'execute' of 'sqlite3.Connection' objects>"),
    ("  clip at the port, before the rows (older trees)", "sinks/semantics.py", "clip_batch"),
    ("reply (pickle)", "~", "<built-in method _pickle.dumps>"),
)


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_wchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


class Shipped(msgspec.Struct):
    """What one store was sent: requests, their bytes, and the rows they carry."""

    requests: int = 0
    request_bytes: int = 0
    rows: dict[str, int] = {}
    counting_cpu: float = 0.0  # this process's CPU spent counting (taken off its figure)


def _count_requests(store_of: dict[int, str], shipped: dict[str, Shipped]) -> None:
    """Wrap ``WriterProcess.call`` to count each request's bytes and rows."""
    original = sqlite_writer.WriterProcess.call

    async def call(self: Any, op: str, *args: Any) -> Any:
        started = time.process_time()
        store = store_of.get(id(self), "?")
        seen = shipped.setdefault(store, Shipped(rows={}))
        seen.requests += 1
        seen.request_bytes += len(sqlite_writer.request(op, args))
        names = {"write_steps": ("steps", "runs", "states"), "write_deep": ("deep",)}.get(op, ())
        for name, records in zip(names, args):
            seen.rows[name] = seen.rows.get(name, 0) + len(records)
        seen.counting_cpu += time.process_time() - started
        return await original(self, op, *args)

    sqlite_writer.WriterProcess.call = call  # type: ignore[method-assign]


async def run(corpus: str, profile_dir: Path | None) -> dict[str, Any]:
    # A writer under a profiler or callgrind takes longer than the store's 10 s to exit
    # once its stdin closes; killed, it would leave no profile (nor callgrind dump).
    sqlite_writer._CLOSE_SECONDS = 600.0
    with open(corpus, "rb") as f:
        blobs = msgspec.msgpack.decode(f.read())
    if profile_dir is not None:
        original_init = sqlite_writer.WriterProcess.__init__

        def init(self: Any, path: str, synchronous: str, busy: int, schema: str) -> None:
            original_init(self, path, synchronous, busy, schema)
            out = profile_dir / f"writer-{schema}.prof"
            self._argv[1:3] = ["-m", "benchmarks.worker_profile", "--as-writer", str(out)]

        sqlite_writer.WriterProcess.__init__ = init  # type: ignore[method-assign]
    shipped: dict[str, Shipped] = {}
    store_of: dict[int, str] = {}
    _count_requests(store_of, shipped)
    with tempfile.TemporaryDirectory() as tmp:
        db = f"{tmp}/profile.db"
        steps = await SqliteStepStore(db).open()
        deep = await SqliteDeepStore(db).open()
        writers = {"steps": steps._db._writer, "deep": deep._db._writer}
        for name, writer in writers.items():
            store_of[id(writer)] = name
        pids = {name: w.pid for name, w in writers.items() if w is not None and w.pid is not None}
        cpu0 = {name: _proc_cpu(pid) for name, pid in pids.items()}
        wchar0 = {name: _proc_wchar(pid) for name, pid in pids.items()}
        pipeline = Pipeline(steps, deep, batch_records=5000)
        profiler = cProfile.Profile(time.process_time) if profile_dir is not None else None
        wall0, main0 = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        for start in range(0, len(blobs), FETCH):
            # As the worker handles a fetch: decode it, load its runs' states in one
            # wait, apply each event, and write (in the background) each full batch.
            fetch = [(decode_event(blob), len(blob)) for blob in blobs[start : start + FETCH]]
            await pipeline.load((event.company_id, event.run_id) for event, _ in fetch)
            for offset, (event, size) in enumerate(fetch, start):
                if pipeline.apply(event, ("t", 0), offset, size):
                    await pipeline.flush(wait=False)
            pipeline.unstage()
        await pipeline.drain()
        if profiler is not None:
            profiler.disable()
        wall, main = time.perf_counter() - wall0, time.process_time() - main0
        main -= sum(s.counting_cpu for s in shipped.values())
        writer_cpu = {name: _proc_cpu(pid) - cpu0[name] for name, pid in pids.items()}
        wchar = {name: _proc_wchar(pid) - wchar0[name] for name, pid in pids.items()}
        await steps.close()
        await deep.close()
        if profiler is not None and profile_dir is not None:
            profiler.dump_stats(str(profile_dir / "main.prof"))
        db_bytes = sum(os.path.getsize(p) for p in Path(tmp).glob("profile.db*"))
    n = len(blobs)
    return {
        "events": n,
        "loadavg": os.getloadavg()[0],
        "wall_seconds": wall,
        "cpu_us_per_event": {"main": main / n * 1e6, **{f"writer {k}": v / n * 1e6 for k, v in writer_cpu.items()},
                             "all": (main + sum(writer_cpu.values())) / n * 1e6},  # fmt: skip
        "batches": pipeline.written_batches,
        "rows_per_event": {f"{store}.{name}": count / n for store, s in shipped.items() for name, count in s.rows.items()},
        "request_bytes_per_event": {store: s.request_bytes / n for store, s in shipped.items()},
        "writer_wchar_per_event": {name: v / n for name, v in wchar.items()},
        "file_bytes_per_event": db_bytes / n,
    }


def _inclusive(stats: pstats.Stats, where: str, names: str | tuple[str, ...]) -> float:
    if isinstance(names, tuple):
        return sum(_inclusive(stats, where, name) for name in names)
    name = names
    total = 0.0
    for (filename, _line, function), (_cc, _nc, _tt, ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if function != name or (where and not filename.endswith(where)):
            continue
        # Only the outermost calls: a recursive function's inner calls are inside.
        if any(c[2] == name and c[0] == filename for c in callers):
            ct = sum(v[3] for c, v in callers.items() if not (c[2] == name and c[0] == filename))
        total += ct
    return total


def breakdown(path: Path, parts: tuple[tuple[str, str, Any], ...]) -> list[tuple[str, float, float]]:
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    return [(label, t, t / total if total else 0.0) for label, where, name in parts
            for t in [_inclusive(stats, where, name)]] + [("total (profiled)", total, 1.0)]  # fmt: skip


def as_writer(out: str, argv: list[str]) -> int:
    """A writer process under cProfile, counting CPU time (not the waits for requests)."""
    profiler = cProfile.Profile(time.process_time)
    path, synchronous, busy, schema = argv
    try:
        return profiler.runcall(sqlite_writer.serve, path, synchronous, int(busy), schema)
    finally:
        profiler.dump_stats(out)


def top(path: Path, count: int) -> list[str]:
    stats = pstats.Stats(str(path))
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:count]  # type: ignore[attr-defined]
    total = stats.total_tt  # type: ignore[attr-defined]
    return [f"      {v[2] / total:6.1%} self  {Path(k[0]).name}:{k[1]} {k[2]}" for k, v in rows]


def main(argv: list[str]) -> None:
    if argv[:1] == ["--as-writer"]:
        sys.exit(as_writer(argv[1], argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus")
    parser.add_argument("--profile", action="store_true", help="split the time with cProfile (slower)")
    parser.add_argument("--top", type=int, default=0, help="with --profile: also the N functions of most own time")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    collector.tune()  # as the worker's process does
    if not args.profile:
        print(msgspec.json.format(msgspec.json.encode(asyncio.run(run(args.corpus, None)))).decode())
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        figures = asyncio.run(run(args.corpus, out))
        print(f"{args.corpus}: {figures['events']} events (profiled: times are cProfile's)")
        for title, file, parts in (("worker process", "main.prof", MAIN_PARTS),
                                   ("steps writer process", "writer-steps.prof", WRITER_PARTS),
                                   ("deep writer process", "writer-deep.prof", WRITER_PARTS)):  # fmt: skip
            print(f"  {title}:")
            for label, seconds, share in breakdown(out / file, parts):
                print(f"    {label:<52} {seconds / figures['events'] * 1e6:8.2f} us/event  {share:6.1%}")
            if args.top:
                print("\n".join(top(out / file, args.top)))


if __name__ == "__main__":
    main(sys.argv[1:])
