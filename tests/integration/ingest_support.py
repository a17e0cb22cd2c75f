"""Shared by the ingest route's tests on the real broker: an asyncio loop
that hosts the API app and its Kafka producer (so sync tests, hypothesis included, can
drive them), a tail of the raw topic, wire events, and ``stepstream api --ingest`` as a
real process for the SDK."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Coroutine
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import httpx
import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stepstream.api.app import ApiApp, create_app
from stepstream.api.ingest import Ingest, IngestLimits
from stepstream.api.kafka_log import KafkaEventLog
from stepstream.api.kafka_txn_log import TransactionalEventLog
from stepstream.api.ratelimit import CompanyBuckets
from stepstream.api.tokens import TokenRegistry
from stepstream.kafka.connection import KafkaConnection
from stepstream.metrics import ApiMetrics, IngestMetrics
from stepstream.sinks.memory import MemoryDeepStore, MemoryStepStore

T = TypeVar("T")
T0 = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
NDJSON = "application/x-ndjson"


class HostLoop:
    """An event loop that runs only inside :meth:`run`, in the caller's thread: the
    producer's and consumer's tasks make progress while a test waits for a request and
    stand still in between (hypothesis draws its examples in between, and flags any
    use of the global ``random`` then, which aiokafka's background tasks make)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


def event(company: str, run_id: str, seq: int, *, kind: str = "thinking_delta", pad: int = 0, tag: str = "") -> dict:
    """A valid wire v1 event; ``pad`` characters of text make it larger."""
    payload: dict[str, Any]
    if kind == "run_start":
        payload = {"agent_name": "ingest-test"}
    elif kind == "run_end":
        payload = {"status": "completed"}
    else:
        payload = {"text": f"thought {seq} " + "x" * pad}
    return {
        "v": 1,
        "event_id": f"{tag}{company}/{run_id}/{seq}",
        "company_id": company,
        "run_id": run_id,
        "seq": seq,
        "ts": (T0 + timedelta(milliseconds=seq)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "type": kind,
        "payload": payload,
    }


def run_events(company: str, run_id: str, steps: int, *, tag: str = "", pad: int = 0) -> list[dict]:
    """``run_start``, ``steps`` thinking deltas, ``run_end``."""
    events = [event(company, run_id, 0, kind="run_start", tag=tag)]
    events += [event(company, run_id, seq, pad=pad, tag=tag) for seq in range(1, steps + 1)]
    events.append(event(company, run_id, steps + 1, kind="run_end", tag=tag))
    return events


def ndjson(events: list[dict]) -> bytes:
    return b"".join(msgspec.json.encode(e) + b"\n" for e in events)


class IngestApp:
    """The API app with the ingest route producing to ``topic``, hosted on ``loop``."""

    def __init__(
        self, loop: HostLoop, broker: str, topic: str, tokens: Path, *, rate: float = 0, burst: int = 0,
        timeout_seconds: float = 10.0, limits: IngestLimits | None = None, connection: KafkaConnection | None = None,
        transactional: bool = False,
    ) -> None:  # fmt: skip
        self.loop = loop
        self.metrics = ApiMetrics()
        self.ingest_metrics = IngestMetrics(self.metrics.registry)
        kind = TransactionalEventLog if transactional else KafkaEventLog
        self.log = kind(connection or KafkaConnection.plaintext(broker), topic, self.ingest_metrics, timeout_seconds=timeout_seconds)
        ingest = Ingest(self.log, CompanyBuckets(rate, burst), limits or IngestLimits(), self.ingest_metrics)
        self.app: ApiApp = create_app(MemoryStepStore(), MemoryDeepStore(), TokenRegistry(tokens), self.metrics, ingest=ingest)
        self.client: httpx.AsyncClient | None = None

    def start(self, connect_timeout: float = 30.0, *, connected: bool = True) -> IngestApp:
        """Start the producer (and, with ``connected``, wait until it is connected)."""

        async def start() -> None:
            await self.log.start()
            self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://api.test")
            deadline = time.monotonic() + connect_timeout
            while connected and not self.log.connected:
                if time.monotonic() > deadline:
                    raise AssertionError("the ingest producer did not connect")
                await asyncio.sleep(0.05)

        self.loop.run(start())
        return self

    def close(self) -> None:
        async def close() -> None:
            if self.client is not None:
                await self.client.aclose()
            await self.log.close()

        self.loop.run(close())

    async def apost(self, company: str, token: str | None, body: bytes, media: str = NDJSON) -> httpx.Response:
        headers = {"content-type": media}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        assert self.client is not None
        return await self.client.post(f"/v1/companies/{company}/events", content=body, headers=headers)

    def post(self, company: str, token: str | None, body: bytes, media: str = NDJSON) -> httpx.Response:
        return self.loop.run(self.apost(company, token, body, media))

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value


class TopicTail:
    """Reads what was appended to a topic since the last :meth:`read` (all partitions):
    what the worker reads (``read_committed``: committed transactions, up to the last
    stable offsets), or with ``committed=False`` every record written."""

    def __init__(self, broker: str, topic: str, *, committed: bool = True) -> None:
        self.broker, self.topic = broker, topic
        self.isolation = "read_committed" if committed else "read_uncommitted"
        self.consumer: AIOKafkaConsumer | None = None
        self.probe: AIOKafkaConsumer | None = None
        self.tps: list[TopicPartition] = []

    async def start(self) -> TopicTail:
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.broker, enable_auto_commit=False, fetch_max_wait_ms=20,
                                         auto_offset_reset="earliest", isolation_level=self.isolation)  # fmt: skip
        await self.consumer.start()
        parts = self.consumer.partitions_for_topic(self.topic) or set()
        while not parts:
            await self.consumer._client.force_metadata_update()
            parts = self.consumer.partitions_for_topic(self.topic) or set()
        self.tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self.consumer.assign(self.tps)
        await self.consumer.seek_to_beginning(*self.tps)
        if self.isolation == "read_committed":  # the log ends, for settle()
            self.probe = AIOKafkaConsumer(bootstrap_servers=self.broker, enable_auto_commit=False)
            await self.probe.start()
        return self

    async def settle(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) until no transaction is open on the topic: the last
        stable offsets equal the log ends. A commit's markers are written after the
        producer's commit returned, so a 202 can come just before its records are
        readable committed."""
        assert self.consumer is not None and self.probe is not None
        deadline = time.monotonic() + timeout
        while True:
            stable, ends = await self.consumer.end_offsets(self.tps), await self.probe.end_offsets(self.tps)
            if stable == ends:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)

    async def read(self, timeout: float = 30.0, *, settle: float = 10.0) -> list[tuple[int, bytes, bytes]]:
        """``(partition, key, value)`` of every record up to the log ends as of now (read
        committed: once no transaction is open, or ``settle`` seconds passed)."""
        assert self.consumer is not None
        if self.probe is not None:
            await self.settle(settle)
        ends = await self.consumer.end_offsets(self.tps)
        out: list[tuple[int, bytes, bytes]] = []
        deadline = time.monotonic() + timeout
        while [tp for tp in self.tps if await self.consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.topic}: the log ends were not reached in {timeout}s")
            for tp, records in (await self.consumer.getmany(timeout_ms=200)).items():
                out.extend((tp.partition, r.key, r.value) for r in records)
        return out

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.probe is not None:
            await self.probe.stop()


async def create_topic(broker: str, partitions: int = 3) -> str:
    name = f"stepstream.test.ingest.{uuid.uuid4().hex[:12]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        for _ in range(100):
            (described,) = await admin.describe_topics([name])
            if described["error_code"] == 0 and all(p["leader"] >= 0 for p in described["partitions"]) \
                    and len(described["partitions"]) == partitions:  # fmt: skip
                break
            await asyncio.sleep(0.05)
    finally:
        await admin.close()
    return name


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ``stepstream api`` behind uvicorn's own TLS listener: argv[1:3] are the certificate
# and key (the API terminates no TLS itself; a proxy does in production, docs/security.md).
_TLS_API = """
import sys
import uvicorn
from stepstream.cli import main

certfile, keyfile = sys.argv[1], sys.argv[2]


class TLSConfig(uvicorn.Config):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, ssl_certfile=certfile, ssl_keyfile=keyfile, **kwargs)


uvicorn.Config = TLSConfig
sys.exit(main(["api"]))
"""


class ApiProcess:
    """``stepstream api --ingest`` as a real process on a free port; with ``tls``
    (certificate, key, the CA that signed them) on ``https://127.0.0.1:P``."""

    def __init__(
        self, broker: str, topic: str, tokens: Path, tmp: Path, *, tls: tuple[Path, Path, Path] | None = None, **env: str
    ) -> None:
        self.port = int(env.get("STEPSTREAM_API_PORT") or free_port())
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._context = None if tls is None else ssl.create_default_context(cafile=str(tls[2]))
        self.log_path = tmp / f"api-{self.port}.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("STEPSTREAM_")}
        environ.update(
            STEPSTREAM_BROKER=broker, STEPSTREAM_TOPIC=topic, STEPSTREAM_TOKENS_FILE=str(tokens),
            STEPSTREAM_STEPS_SINK=f"sqlite:///{tmp / 'api.db'}", STEPSTREAM_API_PORT=str(self.port),
            STEPSTREAM_API_INGEST="true", STEPSTREAM_INGEST_RATE_EVENTS="0",
        )  # fmt: skip
        environ.update(env)
        self._log = self.log_path.open("ab")
        argv = ["-m", "stepstream.cli", "api"] if tls is None else ["-c", _TLS_API, str(tls[0]), str(tls[1])]
        self.proc = subprocess.Popen([sys.executable, *argv], env=environ, stdout=self._log,
                                     stderr=subprocess.STDOUT)  # fmt: skip

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5, context=self._context) as resp:
            return resp.read().decode()

    def wait_connected(self, timeout: float = 60.0) -> ApiProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the API exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if "stepstream_ingest_connected 1.0" in self.metrics():
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the API's ingest producer never connected:\n{self.tail()}")

    def stop(self) -> int:
        if self._log.closed:
            return self.proc.returncode
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
