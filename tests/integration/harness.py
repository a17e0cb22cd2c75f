"""Helpers for worker tests on the real broker: run `stepstream worker` as a real
process (so it can be SIGKILLed), wait for the group to catch up, and dump sinks."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
import urllib.error
import urllib.request
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError

from stepstream.config import load_settings
from stepstream.emitter.producer import Emitter
from stepstream.kafka.topics import ensure_topics
from stepstream.sinks import open_deep_store, open_step_store


#: The session timeout of workers a test SIGKILLs and replaces. A killed member keeps its
#: partitions until its session expires, and the next member's join waits for that: with
#: the product's default (60 s) a test of a dozen kills spent most of two minutes waiting
#: out dead sessions. 6 s still leaves three 2-s heartbeats on a loaded machine.
KILLED_SESSION = {"STEPSTREAM_SESSION_TIMEOUT_SECONDS": "6"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerProcess:
    """One `stepstream worker` subprocess with its own web port and log file."""

    def __init__(self, *, broker: str, topic: str, app_id: str, steps_sink: str, deep_sink: str, log_dir: Path,
                 partitions: int, extra_env: dict[str, str] | None = None, name: str = "w") -> None:
        self.port = free_port()
        self.log_path = log_dir / f"worker-{name}-{self.port}.log"
        env = dict(os.environ)
        env.update(
            STEPSTREAM_BROKER=broker,
            STEPSTREAM_TOPIC=topic,
            STEPSTREAM_APP_ID=app_id,
            STEPSTREAM_STEPS_SINK=steps_sink,
            STEPSTREAM_DEEP_SINK=deep_sink,
            STEPSTREAM_PARTITIONS=str(partitions),
            STEPSTREAM_WEB_PORT=str(self.port),
            STEPSTREAM_IDLE_FLUSH_SECONDS="1.0",
            # STEPSTREAM_TEST_WORKER_LOG_LEVEL=info shows rebalances, commits and shutdown steps.
            STEPSTREAM_LOG_LEVEL=os.environ.get("STEPSTREAM_TEST_WORKER_LOG_LEVEL", "warning"),
        )
        env.update(extra_env or {})
        self._log = self.log_path.open("ab")
        self.stop_seconds: float | None = None  # SIGTERM to exit, once stop() saw it exit
        self.stop_timed_out = False  # stop() had to SIGKILL it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepstream.cli", "worker"], env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def ready(self) -> dict:
        import json

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ready", timeout=5) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            with err:
                return json.loads(err.read())

    def metric_sum(self, name: str) -> float:
        """Sum of every sample called ``name`` (all label sets); -1 if the port is down."""
        try:
            text = self.metrics()
        except OSError:
            return -1.0
        return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)

    def wait_web(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}; log:\n{self.tail()}")
            try:
                self.metrics()
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"worker web port never answered; log:\n{self.tail()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL if the process has not exited within ``timeout`` s.
        How long the exit took is in :attr:`stop_seconds` and at the end of the log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            try:
                self.proc.wait(timeout)
                self.stop_seconds = time.monotonic() - sent
                note = f"\n[harness] exit {self.proc.returncode} {self.stop_seconds:.1f}s after SIGTERM\n"
            except subprocess.TimeoutExpired:
                self.stop_timed_out = True
                note = f"\n[harness] no exit {timeout:.0f}s after SIGTERM; SIGKILL\n"
                self.proc.kill()
                self.proc.wait(10)
            with self.log_path.open("ab") as log:
                log.write(note.encode())
        self._log.close()
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    # -- added for the fault tests (issue 8) ------------------------------------

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pause(self) -> None:
        """SIGSTOP: every thread stops (no heartbeats), the process stays."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM without waiting (see :meth:`wait_exit`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def ready_status(self) -> tuple[int, dict]:
        """``(HTTP status, body)`` of ``/ready``; ``(0, {})`` when the port does not answer."""
        import json

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ready", timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            with err:  # a 503's response holds the socket until it is closed
                return err.code, json.loads(err.read())
        except OSError:
            return 0, {}

    def wait_exit(self, timeout: float) -> int | None:
        """The exit status once the process ends within ``timeout`` s, else ``None``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


async def group_offsets(broker: str, group: str, topic: str) -> tuple[dict[int, int], dict[int, int] | None]:
    """``(log end, committed)`` offsets of ``group`` per partition of ``topic``; committed
    is 0 where nothing is committed yet, and ``None`` while the broker cannot answer
    for the group (a fresh broker still making its offsets topic)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        tps = await _topic_partitions(consumer, topic)
        ends = {tp.partition: offset for tp, offset in (await consumer.end_offsets(tps)).items()}
        try:
            committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        except GroupCoordinatorNotAvailableError:
            return ends, None
        marks = {}
        for tp in tps:
            meta = committed.get(tp)
            marks[tp.partition] = meta.offset if meta is not None and meta.offset >= 0 else 0
        return ends, marks
    finally:
        await consumer.stop()
        await admin.close()


async def wait_caught_up(
    broker: str, group: str, topic: str, workers: list[WorkerProcess], timeout: float = 180.0,
    stall: float | None = None,
) -> list[str]:
    """Wait until ``group`` has committed every partition of ``topic`` to its log end.

    Fails when a worker in ``workers`` dies, after ``timeout`` s in all, or, with
    ``stall``, as soon as no committed offset of the group has moved for ``stall`` s
    while it still lags: a worker that keeps committing on a slow (loaded) machine is
    waited for up to ``timeout``; a stall fails after ``stall`` s. The message lists the
    lag of every partition over the wait, so a partition that stalled shows; that
    history (one line per change) is also what it returns."""
    start = time.monotonic()
    deadline = start + timeout
    progress_at = start
    last: dict[int, int] | None = None
    history: list[str] = []
    lag = None
    while True:
        for w in workers:
            if not w.alive():
                raise AssertionError(f"worker died (rc={w.proc.returncode}):\n{w.tail()}")
        ends, offsets = await group_offsets(broker, group, topic)
        now = time.monotonic()
        committed = offsets if offsets is not None else {p: 0 for p in ends}
        lags = {p: ends[p] - committed[p] for p in sorted(ends)}
        lag = sum(lags.values())
        if lag == 0 and offsets is not None:
            history.append(f"{now - start:6.1f}s caught up")
            return history
        if committed != last:
            progress_at = now
            last = committed
            history.append(f"{now - start:6.1f}s lag {lag}: " + " ".join(f"p{p}={n}" for p, n in lags.items()))
        stalled = stall is not None and now - progress_at > stall
        if stalled or now > deadline:
            logs = "\n---\n".join(w.tail() for w in workers)
            why = f"no committed offset moved for {stall}s" if stalled else f"still lagging after {timeout}s"
            raise AssertionError(
                f"group {group} lags {lag} records ({why}); lag per partition at each change:\n"
                + "\n".join(history[-30:]) + f"\nnow: {lags}\nlogs:\n{logs}"
            )
        await asyncio.sleep(0.5)


async def dump(steps_url: str, deep_url: str, companies: list[str]) -> dict:
    """Everything the sinks hold for these companies, as plain comparable data."""
    import msgspec

    steps = await open_step_store(steps_url)
    deep = await open_deep_store(deep_url)
    out: dict = {}
    try:
        for company in companies:
            runs = await steps.list_runs(company, limit=100_000)
            for run in runs:
                key = f"{company}/{run.run_id}"
                out[key] = {
                    "run": msgspec.to_builtins(run),
                    "steps": [msgspec.to_builtins(s) for s in await steps.get_steps(company, run.run_id)],
                    "deep": [msgspec.to_builtins(d) for d in await deep.get_deep(company, run.run_id)],
                }
    finally:
        await steps.close()
        await deep.close()
    return out


def first_difference(a: dict, b: dict) -> str:
    if a.keys() != b.keys():
        return f"runs differ: only left {sorted(a.keys() - b.keys())[:5]}, only right {sorted(b.keys() - a.keys())[:5]}"
    for key in sorted(a):
        for part in ("run", "steps", "deep"):
            if a[key][part] != b[key][part]:
                left, right = a[key][part], b[key][part]
                if isinstance(left, list):
                    if len(left) != len(right):
                        return f"{key} {part}: {len(left)} vs {len(right)} rows"
                    for x, y in zip(left, right):
                        if x != y:
                            return f"{key} {part}:\n  {x}\n  {y}"
                return f"{key} {part}:\n  {left}\n  {right}"
    return "no difference"


class Scenario:
    def __init__(self, broker: str, tmp: Path, partitions: int = 4) -> None:
        self.partitions = partitions
        tag = uuid.uuid4().hex[:8]
        self.broker = broker
        self.topic = f"events-{tag}"
        self.group = f"stepstream-test-{tag}"
        self.tmp = tmp
        self.steps_url = f"sqlite:///{tmp / 'steps.db'}"
        self.deep_url = f"sqlite:///{tmp / 'deep.db'}"
        self.workers: list[WorkerProcess] = []

    def settings(self):
        return load_settings({"broker": self.broker, "topic": self.topic, "partitions": self.partitions}, environ={})

    async def create_topics(self) -> None:
        await ensure_topics(self.settings())

    def start_worker(self, name: str = "w", **env: str) -> WorkerProcess:
        worker = WorkerProcess(
            broker=self.broker, topic=self.topic, app_id=self.group, steps_sink=self.steps_url,
            deep_sink=self.deep_url, log_dir=self.tmp, partitions=self.partitions, extra_env=env, name=name,
        )
        self.workers.append(worker)
        return worker

    async def produce(self, events) -> None:
        async with Emitter(self.broker, self.topic) as emitter:
            await emitter.emit_many(events)

    def stop_all(self) -> None:
        for w in self.workers:
            w.stop()


# -- added for the fault tests (issue 8) ---------------------------------------------


async def _topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    parts = consumer.partitions_for_topic(topic) or set()
    if not parts:
        await consumer._client.force_metadata_update()
        parts = consumer.partitions_for_topic(topic) or set()
    return [TopicPartition(topic, p) for p in sorted(parts)]


async def end_offsets(broker: str, topic: str) -> dict[int, int]:
    """Log-end offset of every partition of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = await _topic_partitions(consumer, topic)
        return {tp.partition: offset for tp, offset in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def committed_offsets(broker: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition of ``topic`` (0 where nothing is committed)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        try:
            committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        except GroupCoordinatorNotAvailableError:
            return {p: 0 for p in range(partitions)}
        out = {}
        for tp in tps:
            meta = committed.get(tp)
            out[tp.partition] = meta.offset if meta is not None and meta.offset >= 0 else 0
        return out
    finally:
        await admin.close()


async def read_topic(broker: str, topic: str, timeout: float = 60.0) -> list:
    """Every record of ``topic`` up to its current log end, per partition in offset order
    (of committed transactions only, as the worker reads: the API's ingest route
    produces in transactions; a partition is at its end when the consumer's position,
    which passes over transaction markers, is)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False, auto_offset_reset="earliest",
                                isolation_level="read_committed")  # fmt: skip
    await consumer.start()
    try:
        tps = await _topic_partitions(consumer, topic)
        ends = await _settled_ends(broker, consumer, tps)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records: list = []
        remaining = {tp for tp in tps if ends[tp] > 0}
        deadline = time.monotonic() + timeout
        while remaining:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: read {len(records)} records, partitions {remaining} not at their end")
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for tp, got in batch.items():
                records.extend(r for r in got if r.offset < ends[tp])
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        records.sort(key=lambda r: (r.partition, r.offset))
        return records
    finally:
        await consumer.stop()


async def _settled_ends(broker: str, committed: AIOKafkaConsumer, tps: list, timeout: float = 10.0) -> dict:
    """The last stable offsets once they equal the log ends (no transaction open), or
    after ``timeout``: a commit's markers are written just after the producer's commit
    returned (and the API answered 202)."""
    probe = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    await probe.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            stable, ends = await committed.end_offsets(tps), await probe.end_offsets(tps)
            if stable == ends or time.monotonic() > deadline:
                return stable
            await asyncio.sleep(0.02)
    finally:
        await probe.stop()


async def golden_dump(events, base: Path, companies: list[str]) -> dict:
    """What ``ingest-file`` of ``events`` leaves in fresh SQLite sinks, as :func:`dump` data."""
    from stepstream.core.wire import encode_event
    from stepstream.ingest.offline import ingest_file

    base.mkdir(parents=True, exist_ok=True)
    path = base / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    url = f"sqlite:///{base / 'golden.db'}"
    report = await ingest_file(path, url, url, progress=False)
    assert report.rejected == 0 and report.events == len(events), report
    return await dump(url, url, companies)


async def run_states(steps_url: str, runs: dict[str, list[str]]) -> dict[tuple[str, str], int]:
    """``last_seq`` of every stored run state among ``runs`` (company -> run ids)."""
    steps = await open_step_store(steps_url)
    try:
        out = {}
        for company, run_ids in runs.items():
            for run_id, state in (await steps.load_states(company, run_ids)).items():
                out[(company, run_id)] = state.last_seq
        return out
    finally:
        await steps.close()


class StateWatch:
    """Polls the step store's run states (through the port) while a test runs and
    records every run whose ``last_seq`` ever moved backwards between two polls."""

    def __init__(self, steps_url: str, runs: dict[str, list[str]], interval: float = 0.1) -> None:
        self.steps_url = steps_url
        self.runs = runs
        self.interval = interval
        self.latest: dict[tuple[str, str], int] = {}
        self.regressions: list[tuple[str, str, int, int]] = []  # company, run, before, after
        self.polls = 0
        self._task: asyncio.Task | None = None

    async def _loop(self) -> None:
        steps = await open_step_store(self.steps_url)
        try:
            while True:
                for company, run_ids in self.runs.items():
                    for run_id, state in (await steps.load_states(company, run_ids)).items():
                        key = (company, run_id)
                        before = self.latest.get(key, -1)
                        if state.last_seq < before:
                            self.regressions.append((company, run_id, before, state.last_seq))
                        self.latest[key] = state.last_seq
                self.polls += 1
                await asyncio.sleep(self.interval)
        finally:
            await steps.close()

    def start(self) -> StateWatch:
        self._task = asyncio.ensure_future(self._loop())
        return self

    async def stop(self) -> None:
        task = self._task
        if task is None:
            return
        if task.done():
            task.result()  # a poll that failed fails the test
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


async def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll ``predicate`` (sync or async) until it returns a truthy value; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def sink_watermarks(broker: str, topic: str, steps_url: str) -> dict[int, int]:
    """The durable watermark per partition as the sinks show it: the offset of the first
    event not reflected in its run's stored state (``last_seq`` below its ``seq``), or
    the log end. Messages that do not decode (dead letters) count as reflected."""
    from stepstream.core.wire import decode_event
    from stepstream.errors import WireError

    records = await read_topic(broker, topic)
    ends = await end_offsets(broker, topic)
    events = []
    runs: dict[str, set[str]] = {}
    for record in records:
        try:
            event = decode_event(record.value if record.value is not None else b"")
        except WireError:
            continue
        events.append((record, event))
        runs.setdefault(event.company_id, set()).add(event.run_id)
    states = await run_states(steps_url, {company: sorted(ids) for company, ids in runs.items()})
    marks = dict(ends)
    for record, event in events:
        if states.get((event.company_id, event.run_id), -1) < event.seq and record.offset < marks[record.partition]:
            marks[record.partition] = record.offset
    return marks


async def explain_lag(scenario: Scenario) -> str:
    """Per partition: committed offset, log end and the sinks' durable watermark."""
    ends = await end_offsets(scenario.broker, scenario.topic)
    committed = await committed_offsets(scenario.broker, scenario.group, scenario.topic, scenario.partitions)
    marks = await sink_watermarks(scenario.broker, scenario.topic, scenario.steps_url)
    return "; ".join(
        f"p{p}: committed {committed[p]}, end {ends[p]}, first event not in the sinks {marks[p]}" for p in sorted(ends)
    )
