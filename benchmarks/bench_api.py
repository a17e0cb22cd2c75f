"""API load: concurrent readers against ``stepstream api`` while a writer ingests.

    PYTHONPATH=services python -m benchmarks.bench_api [--readers 16] [--seconds 10]
        [--seed-runs 120] [--write-runs 600] [--broker HOST:PORT]

Everything is local and bounded: a SQLite store (durable defaults) seeded with
``--seed-runs`` generated runs over 4 companies, the API served by uvicorn in its
own process (``stepstream api``), and a writer in a third process writing
``--write-runs`` more runs into the same database while the readers run: with
``--broker`` (``make bench`` passes one), ``stepstream worker`` consuming a fresh
topic that the producer SDK fills; without, ``stepstream ingest-file`` (the
worker's own pipeline and batch writer, without Kafka). Each
reader loops: list a page of runs (``limit=50``), read one run with its steps, read
its deep bodies, for ``--seconds`` or ``--max-requests`` in all. Every non-200
answer or transport error counts as an error. Reported: requests, errors,
requests/s, and latency p50/p95/p99/max overall and per route (client side: the
request sent to the last byte read, on a machine whose cores the writer shares).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec

from benchmarks.worker_process import cpu_seconds
from stepstream.api.tokens import add_token
from stepstream.core.wire import encode_event
from stepstream.emitter.corpus import generate_events
from stepstream.ingest.offline import ingest_file

COMPANY = "co-00"
ROUTES = ("list_runs", "get_run", "get_deep")


@dataclass
class LoadReport:
    readers: int
    seconds: float
    writer: str = ""
    requests: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROUTES})
    writer_events: int = 0
    writer_seconds: float = 0.0
    writer_exit: int | None = None
    writer_overlap: bool = False  # the writer was still writing when the readers stopped
    baseline: LoadReport | None = None  # the same readers before the writer started
    api_cpu_seconds: float = 0.0  # CPU time of the API process over this phase

    def quantile(self, q: float, route: str | None = None) -> float:
        values = sorted(self.latencies[route] if route else [v for vs in self.latencies.values() for v in vs])
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))]

    def lines(self) -> list[str]:
        out = []
        if self.baseline is not None:
            out += ["-- readers alone (no writer):", *self.baseline.lines()[:1], *self.baseline.lines()[2:3]]
            out += ["-- readers while the writer writes:"]
        out += [
            f"readers {self.readers}, {self.seconds:.1f} s: {self.requests} requests, {self.errors} errors, "
            f"{self.requests / self.seconds:.0f} req/s, API process CPU "
            f"{self.api_cpu_seconds * 1e3 / max(self.requests, 1):.2f} ms per request",
            f"writer {self.writer}: {self.writer_events} events in {self.writer_seconds:.1f} s, exit {self.writer_exit}, "
            f"{'still writing when the readers stopped' if self.writer_overlap else 'finished before the readers stopped'}",
        ]
        for route in (None, *ROUTES):
            n = len(self.latencies[route]) if route else self.requests
            out.append(
                f"  {route or 'all':10s} n={n:6d}  p50 {self.quantile(0.5, route) * 1e3:7.1f} ms"
                f"  p95 {self.quantile(0.95, route) * 1e3:7.1f} ms  p99 {self.quantile(0.99, route) * 1e3:7.1f} ms"
                f"  max {self.quantile(1.0, route) * 1e3:7.1f} ms"
            )
        out += [f"  error: {e}" for e in self.error_samples]
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_jsonl(path: Path, events: list) -> int:
    with path.open("wb") as fh:
        for event in events:
            fh.write(encode_event(event) + b"\n")
    return len(events)


async def _wait_healthy(base: str, api: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base, timeout=2) as http:
        while time.monotonic() < deadline:
            if api.poll() is not None:
                raise RuntimeError(f"stepstream api exited with {api.returncode}")
            try:
                if (await http.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("stepstream api did not become healthy")


async def _readers(base: str, token: str, report: LoadReport, max_requests: int, seed: int) -> None:
    deadline = time.monotonic() + report.seconds
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=report.readers, max_keepalive_connections=report.readers)

    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30, limits=limits) as http:

        async def timed(route: str, url: str) -> httpx.Response | None:
            if report.requests >= max_requests or time.monotonic() >= deadline:
                return None
            report.requests += 1
            started = time.perf_counter()
            try:
                response = await http.get(url)
                await response.aread()
            except httpx.HTTPError as exc:
                report.errors += 1
                if len(report.error_samples) < 5:
                    report.error_samples.append(f"{route}: {type(exc).__name__}")
                return None
            report.latencies[route].append(time.perf_counter() - started)
            if response.status_code != 200:
                report.errors += 1
                if len(report.error_samples) < 5:
                    report.error_samples.append(f"{route}: {response.status_code} {response.text[:120]}")
                return None
            return response

        async def reader(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            while time.monotonic() < deadline and report.requests < max_requests:
                page = await timed("list_runs", f"/v1/companies/{COMPANY}/runs?limit=50")
                if page is None:
                    continue
                runs = msgspec.json.decode(page.content)["runs"]
                if not runs:
                    continue
                run_id = httpx.URL(path=rng.choice(runs)["run_id"].replace(".", "%2E")).raw_path.decode()
                await timed("get_run", f"/v1/companies/{COMPANY}/runs/{run_id}")
                await timed("get_deep", f"/v1/companies/{COMPANY}/runs/{run_id}/deep")

        await asyncio.gather(*(reader(i) for i in range(report.readers)))


class IngestFileWriter:
    """``stepstream ingest-file`` over the write corpus, in its own process."""

    name = "ingest-file"

    def __init__(self, events: list, workdir: Path, env: dict[str, str]) -> None:
        self.path = workdir / "write.jsonl"
        self.count = _write_jsonl(self.path, events)
        self.env = env
        self.log = workdir / "writer.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stepstream.cli", "ingest-file", str(self.path), "--no-progress"],
                env=self.env,
                stderr=log,
            )

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class KafkaWorkerWriter:
    """``stepstream worker`` on a fresh topic of the real broker, fed by ``stepstream
    demo`` (the same generated corpus, produced from its own process so that the
    readers' process measures only itself); done when every event is applied."""

    name = "worker (Kafka)"

    def __init__(self, seed: int, runs: int, workdir: Path, env: dict[str, str], broker: str) -> None:
        from benchmarks.worker_process import Worker

        self.seed, self.runs = seed, runs
        self.count = len(generate_events(seed, runs=runs, companies=4))
        self.topic = f"bench-api-{uuid.uuid4().hex[:8]}"
        self.env = {**env, "STEPSTREAM_BROKER": broker, "STEPSTREAM_TOPIC": self.topic, "STEPSTREAM_PARTITIONS": "4"}
        self.log = workdir / "producer.log"
        self.worker = Worker(broker, self.topic, workdir, "api-writer", steps_sink=env["STEPSTREAM_STEPS_SINK"],
                             partitions=4)  # fmt: skip
        self.producer: subprocess.Popen | None = None

    def start(self) -> None:
        self.worker.wait_ready()
        demo = ["demo", "--runs", str(self.runs), "--companies", "4", "--seed", str(self.seed)]
        with self.log.open("wb") as log:
            self.producer = subprocess.Popen(
                [sys.executable, "-m", "stepstream.cli", *demo], env=self.env, stderr=log
            )

    def wait(self, timeout: float) -> int:
        assert self.producer is not None
        if self.producer.wait(timeout=timeout) != 0:
            return self.producer.returncode
        applied = self.worker.wait_events(self.count, timeout)
        return 0 if applied >= self.count else 1

    def stop(self) -> None:
        if self.producer is not None and self.producer.poll() is None:
            self.producer.kill()
            self.producer.wait()
        self.worker.stop()


def run_load(
    workdir: Path,
    *,
    readers: int = 16,
    seconds: float = 10.0,
    seed_runs: int = 120,
    write_runs: int = 600,
    max_requests: int = 200_000,
    seed: int = 11,
    broker: str | None = None,
    baseline_seconds: float = 0.0,
) -> LoadReport:
    """Seed, start the API and the writer, read concurrently; see the module docstring.
    With ``broker`` the writer is ``stepstream worker`` on the real broker, else
    ``stepstream ingest-file``."""
    url = f"sqlite:///{workdir / 'api-load.db'}"
    seed_file = workdir / "seed.jsonl"
    _write_jsonl(seed_file, generate_events(seed, runs=seed_runs, companies=4))
    asyncio.run(ingest_file(seed_file, url, url, progress=False))
    tokens = workdir / "tokens.json"
    token, _ = add_token(tokens, COMPANY, ["steps:read", "deep:read"], created="bench")
    env = {**os.environ, "STEPSTREAM_STEPS_SINK": url, "STEPSTREAM_TOKENS_FILE": str(tokens)}
    writer: IngestFileWriter | KafkaWorkerWriter
    if broker:
        writer = KafkaWorkerWriter(seed + 1, write_runs, workdir, env, broker)
    else:
        writer = IngestFileWriter(generate_events(seed + 1, runs=write_runs, companies=4), workdir, env)
    report = LoadReport(readers=readers, seconds=seconds, writer=writer.name)
    port = _free_port()
    with (workdir / "api.log").open("wb") as api_log:
        api = subprocess.Popen([sys.executable, "-m", "stepstream.cli", "api", "--port", str(port)], env=env,
                               stderr=api_log)  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        asyncio.run(_wait_healthy(base, api))
        if baseline_seconds > 0:
            report.baseline = LoadReport(readers=readers, seconds=baseline_seconds, writer="none")
            cpu = cpu_seconds(api.pid)
            asyncio.run(_readers(base, token, report.baseline, max_requests, seed))
            report.baseline.api_cpu_seconds = cpu_seconds(api.pid) - cpu
        writer_started = time.monotonic()
        writer.start()
        outcome: list[tuple[int, float]] = []
        waiter = threading.Thread(target=lambda: outcome.append((writer.wait(600), time.monotonic())), daemon=True)
        waiter.start()
        cpu = cpu_seconds(api.pid)
        asyncio.run(_readers(base, token, report, max_requests, seed))
        report.api_cpu_seconds = cpu_seconds(api.pid) - cpu
        report.writer_overlap = not outcome
        waiter.join(timeout=600)
        report.writer_exit, finished = outcome[0] if outcome else (None, time.monotonic())
        report.writer_seconds = finished - writer_started
        report.writer_events = writer.count
    finally:
        writer.stop()
        api.send_signal(signal.SIGTERM)
        try:
            api.wait(timeout=20)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_api")
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed-runs", type=int, default=120)
    parser.add_argument("--write-runs", type=int, default=600)
    parser.add_argument("--broker", help="write with `stepstream worker` on this broker (else ingest-file)")
    parser.add_argument("--baseline-seconds", type=float, default=5.0, help="readers alone first, for comparison [5]")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stepstream-bench-api-") as tmp:
        report = run_load(
            Path(tmp), readers=args.readers, seconds=args.seconds, seed_runs=args.seed_runs,
            write_runs=args.write_runs, broker=args.broker, baseline_seconds=args.baseline_seconds,
        )  # fmt: skip
    for line in report.lines():
        print(line, flush=True)
    return 1 if report.errors or report.writer_exit else 0


if __name__ == "__main__":
    raise SystemExit(main())
