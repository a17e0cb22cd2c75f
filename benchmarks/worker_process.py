"""One ``stepstream worker`` subprocess under measurement, for ``bench_worker``.

The worker is started through its CLI with ``STEPSTREAM_*`` variables only (so the
same benchmark measures any version of it), and observed from outside: its
``/metrics`` page, and ``/proc/<pid>`` for CPU time and run-queue wait (all
threads) and peak RSS.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import msgspec
from prometheus_client.parser import text_string_to_metric_families

TICKS = os.sysconf("SC_CLK_TCK")
EVENTS = "stepstream_events_total"


class Sample(msgspec.Struct, frozen=True):
    """One observation of the worker: wall time, events applied, CPU seconds, and
    seconds its threads were runnable but waiting for a CPU."""

    at: float
    events: float
    cpu: float
    runqueue: float


class Throughput(msgspec.Struct, frozen=True):
    """Events applied (durable) between the first and the last sample."""

    events: float
    seconds: float
    cpu: float
    peak_rss_mib: float
    runqueue: float = float("nan")
    duplicates: float = 0.0  # events the worker skipped as already applied (should be 0)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("nan")

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu / self.events * 1e6 if self.events else float("nan")

    @property
    def off_cpu_share(self) -> float:
        """1 - CPU/wall: the share of the window the process was not running (it can go
        negative when several of its threads ran at once)."""
        return 1 - self.cpu / self.seconds if self.seconds > 0 else float("nan")

    @property
    def runqueue_share(self) -> float:
        """The part of the off-CPU share spent runnable, waiting for a core (the
        machine's other load), summed over threads; the rest is waiting on I/O."""
        return self.runqueue / self.seconds if self.seconds > 0 else float("nan")


def tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it (the SQLite sink's writer processes)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _own_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_seconds(pid: int) -> float:
    """User + system CPU so far of every thread of ``pid`` and of its descendants
    (those alive now: the worker's writer processes live as long as it does)."""
    return sum(_own_cpu(p) for p in tree(pid))


def runqueue_seconds(pid: int) -> float:
    """Seconds the threads of ``pid`` and its descendants (those alive now) spent
    runnable but not running."""
    total = 0
    for p in tree(pid):
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def _hwm_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory of ``pid`` plus that of each of its descendants."""
    total = sum(_hwm_mib(p) for p in tree(pid))
    return total if total else float("nan")


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample named ``name`` (all label values)."""
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def histogram_quantile(text: str, name: str, q: float, **match: str) -> float:
    """Prometheus' histogram_quantile over the cumulative buckets of ``name``, summed
    over the series whose labels include ``match`` (all series by default)."""
    by_le: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name + "_bucket" and all(s.labels.get(k) == v for k, v in match.items()):
                le = float(s.labels["le"])
                by_le[le] = by_le.get(le, 0.0) + s.value
    buckets = sorted(by_le.items())
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1e-9)
        prev_le, prev_count = le, count
    return buckets[-1][0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerFailed(Exception):
    """The worker exited (or never answered); the message ends with its log tail."""


class Worker:
    """``python -m stepstream.cli worker`` on ``topic`` into ``steps_sink`` (and
    ``deep_sink``, default the same), logging to ``<tmp>/<name>.log``."""

    def __init__(self, broker: str, topic: str, tmp: Path, name: str, *, steps_sink: str,
                 deep_sink: str = "", partitions: int, env: dict[str, str] | None = None,
                 python: str = sys.executable) -> None:  # fmt: skip
        self.name = name
        self.port = free_port()
        variables = dict(os.environ)
        variables.update(
            STEPSTREAM_BROKER=broker,
            STEPSTREAM_TOPIC=topic,
            STEPSTREAM_APP_ID=f"bench-{name}-{uuid.uuid4().hex[:6]}",
            STEPSTREAM_STEPS_SINK=steps_sink,
            STEPSTREAM_DEEP_SINK=deep_sink,
            STEPSTREAM_PARTITIONS=str(partitions),
            STEPSTREAM_WEB_PORT=str(self.port),
            STEPSTREAM_LOG_LEVEL="error",
        )
        variables.update(env or {})
        self.log_path = tmp / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [python, "-m", "stepstream.cli", "worker"], env=variables, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> str:
        return self._get("/metrics")[1]

    def events(self) -> float:
        return metric_sum(self.metrics(), EVENTS)

    def sample(self) -> Sample:
        events = self.events()
        return Sample(time.perf_counter(), events, cpu_seconds(self.pid), runqueue_seconds(self.pid))

    def failure(self, what: str) -> WorkerFailed:
        self._log.flush()
        tail = self.log_path.read_bytes()[-1500:].decode("utf-8", "replace").strip()
        return WorkerFailed(f"{self.name}: {what} (exit {self.proc.poll()}); log tail:\n{tail}")

    def wait_up(self, timeout: float = 60.0) -> None:
        """Until ``/metrics`` answers; :class:`WorkerFailed` if the process exits first."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise self.failure("exited during startup")
            try:
                self.metrics()
                return
            except OSError:
                time.sleep(0.1)
        raise self.failure(f"no /metrics after {timeout:.0f}s")

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Until ``/ready`` says 200 (partitions assigned, stores open); False on timeout."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise self.failure("exited while joining")
            try:
                if self._get("/ready")[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def wait_events(self, total: float, timeout: float) -> float:
        """Until the worker applied ``total`` events; returns the count reached."""
        deadline = time.perf_counter() + timeout
        n = 0.0
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise self.failure("exited")
            n = self.events()
            if n >= total:
                break
            time.sleep(0.1)
        return n

    def measure(self, total: int, budget: float, timeout: float = 900.0, interval: float = 0.1) -> Throughput:
        """Throughput over a pre-loaded topic: from the first sample with applied events
        (startup and group join excluded, with the first batch) until ``total`` events
        are applied, or ``budget`` seconds passed since that first sample and at least
        one more batch became durable."""
        started = time.perf_counter()
        first: Sample | None = None
        last: Sample | None = None
        while time.perf_counter() - started < timeout:
            if self.proc.poll() is not None:
                raise self.failure("exited during the measurement")
            last = self.sample()
            if first is None and last.events > 0:
                first = last
            if first is not None and last.events > first.events:
                if last.events >= total or last.at - first.at >= budget:
                    break
            time.sleep(interval)
        if first is None or last is None or last.events <= first.events:
            applied = last.events if last else 0
            raise self.failure(f"applied {applied:.0f} of {total} events in {time.perf_counter() - started:.0f}s")
        return Throughput(
            events=last.events - first.events,
            seconds=last.at - first.at,
            cpu=last.cpu - first.cpu,
            peak_rss_mib=peak_rss_mib(self.pid),
            runqueue=last.runqueue - first.runqueue,
            duplicates=metric_sum(self.metrics(), "stepstream_duplicate_events_total"),
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
