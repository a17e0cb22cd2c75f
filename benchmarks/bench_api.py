"""API load: concurrent readers against ``stepstream api`` while a writer ingests.

    PYTHONPATH=services python -m benchmarks.bench_api [--readers 16] [--seconds 10]
        [--seed-runs 120] [--write-runs 600]

Everything is local and bounded: a SQLite store (durable defaults) seeded with
``--seed-runs`` generated runs over 4 companies, the API served by uvicorn in its
own process (``stepstream api``), and the writer, ``stepstream ingest-file`` (the
worker's own pipeline and batch writer, without Kafka), in a third process writing
``--write-runs`` more runs into the same database while the readers run. Each
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import msgspec

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
    requests: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROUTES})
    writer_events: int = 0
    writer_seconds: float = 0.0
    writer_exit: int | None = None
    writer_overlap: bool = False  # the writer was still writing when the readers stopped

    def quantile(self, q: float, route: str | None = None) -> float:
        values = sorted(self.latencies[route] if route else [v for vs in self.latencies.values() for v in vs])
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))]

    def lines(self) -> list[str]:
        out = [
            f"readers {self.readers}, {self.seconds:.1f} s: {self.requests} requests, {self.errors} errors, "
            f"{self.requests / self.seconds:.0f} req/s",
            f"writer: {self.writer_events} events in {self.writer_seconds:.1f} s, exit {self.writer_exit}, "
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


def run_load(
    workdir: Path,
    *,
    readers: int = 16,
    seconds: float = 10.0,
    seed_runs: int = 120,
    write_runs: int = 600,
    max_requests: int = 200_000,
    seed: int = 11,
) -> LoadReport:
    """Seed, start the API and the writer, read concurrently; see the module docstring."""
    db = workdir / "api-load.db"
    url = f"sqlite:///{db}"
    seed_file, write_file = workdir / "seed.jsonl", workdir / "write.jsonl"
    _write_jsonl(seed_file, generate_events(seed, runs=seed_runs, companies=4))
    written = _write_jsonl(write_file, generate_events(seed + 1, runs=write_runs, companies=4))
    asyncio.run(ingest_file(seed_file, url, url, progress=False))
    tokens = workdir / "tokens.json"
    token, _ = add_token(tokens, COMPANY, ["steps:read", "deep:read"], created="bench")
    port = _free_port()
    env = {**os.environ, "STEPSTREAM_STEPS_SINK": url, "STEPSTREAM_TOKENS_FILE": str(tokens)}
    cli = [sys.executable, "-m", "stepstream.cli"]
    report = LoadReport(readers=readers, seconds=seconds)
    with (workdir / "api.log").open("wb") as api_log, (workdir / "writer.log").open("wb") as writer_log:
        _serve_and_read(cli, env, port, api_log, writer_log, token, report, write_file, written, max_requests, seed)
    return report


def _serve_and_read(
    cli: list[str],
    env: dict[str, str],
    port: int,
    api_log: IO[bytes],
    writer_log: IO[bytes],
    token: str,
    report: LoadReport,
    write_file: Path,
    written: int,
    max_requests: int,
    seed: int,
) -> None:
    """The API process up, the writer process started, the readers run; both stopped after."""
    api = subprocess.Popen([*cli, "api", "--port", str(port)], env=env, stderr=api_log)
    writer = None
    try:
        base = f"http://127.0.0.1:{port}"
        asyncio.run(_wait_healthy(base, api))
        writer_started = time.monotonic()
        writer = subprocess.Popen(
            [*cli, "ingest-file", str(write_file), "--no-progress"], env=env, stderr=writer_log
        )
        finished: list[float] = []
        waiter = threading.Thread(target=lambda: (writer.wait(), finished.append(time.monotonic())), daemon=True)
        waiter.start()
        asyncio.run(_readers(base, token, report, max_requests, seed))
        report.writer_overlap = not finished
        waiter.join(timeout=600)
        report.writer_exit = writer.returncode
        report.writer_seconds = (finished[0] if finished else time.monotonic()) - writer_started
        report.writer_events = written
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.wait()
        api.send_signal(signal.SIGTERM)
        try:
            api.wait(timeout=20)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_api")
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed-runs", type=int, default=120)
    parser.add_argument("--write-runs", type=int, default=600)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stepstream-bench-api-") as tmp:
        report = run_load(
            Path(tmp), readers=args.readers, seconds=args.seconds, seed_runs=args.seed_runs, write_runs=args.write_runs
        )
    for line in report.lines():
        print(line, flush=True)
    return 1 if report.errors or report.writer_exit else 0


if __name__ == "__main__":
    raise SystemExit(main())
