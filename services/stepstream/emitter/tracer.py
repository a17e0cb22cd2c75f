"""The producer SDK agents use: a :class:`Tracer` per process, a :class:`Run`
(``stepstream.emitter.run``) per agent run. Import both from ``stepstream.emitter``.

::

    from stepstream.emitter import Tracer

    tracer = Tracer("kafka://127.0.0.1:9092")          # or "127.0.0.1:9092"
    # On a secured cluster (or from STEPSTREAM_KAFKA_* when these are not passed):
    # Tracer("b0:9093", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
    #        sasl_username="agents", sasl_password_file="/run/secrets/kafka-password",
    #        ssl_cafile="/etc/kafka/ca.pem")
    # Or through the API (writes for the token's company only, no Kafka credentials;
    # the token from STEPSTREAM_TOKEN when not passed, a private CA with ssl_cafile=):
    # Tracer("https://api.example", token=ingest_token, ssl_cafile="/etc/stepstream/ca.pem")
    with tracer.run("acme", agent_name="support-bot") as run:
        run.llm_request("c1", provider="anthropic", model="claude-sonnet-4", input=messages)
        run.thinking("the invoice total looks doubled")
        run.tool_call("t1", "db.query", {"sql": "SELECT 1"})
        run.tool_result("t1", [{"id": 1}])
    tracer.close()                                      # or let interpreter exit flush it

Contracts:

- **Connection.** Brokers and security form one
  :class:`~stepstream.kafka.connection.KafkaConnection`: pass one as ``broker``, or a
  broker string and the security keywords (``security_protocol``, ``sasl_mechanism``,
  ``sasl_username``, ``sasl_password`` or ``sasl_password_file``, ``ssl_cafile``,
  ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``); what is not passed comes
  from ``STEPSTREAM_BROKER`` and ``STEPSTREAM_KAFKA_*``, read once, in the constructor.
  A bad setting raises :class:`~stepstream.errors.ConfigError` there.
- **Envelope.** Every call builds one wire v1 event: a fresh ``event_id`` (UUID4), the
  run's next ``seq`` (from 0, one counter per run, assigned under the run's lock so
  calls from several threads or tasks still get strictly increasing numbers in the
  order they are queued) and ``ts`` (now, UTC, RFC 3339). The Kafka key is
  ``{company_id}/{run_id}``, so one run stays on one partition, in order.
- **Never blocks.** A call encodes the event and appends it to a bounded queue; a
  background thread (its own asyncio loop, an idempotent aiokafka producer with
  ``acks=all``) sends it. When ``max_queue`` events are queued or in flight, a new
  event is dropped and counted (:attr:`Tracer.dropped`); its ``seq`` is used anyway,
  so the loss shows downstream as a sequence gap of that run. No call waits for the
  broker; a broker that is down only fills the queue.
- **Over HTTP.** With an ``http://`` or ``https://`` URL and a ``token`` (scope
  ``ingest``; when not passed, ``STEPSTREAM_TOKEN``), the same queue is sent in batches
  to the API's ``POST /v1/companies/{company}/events``
  (``stepstream.emitter.http_sender``: retries with backoff on 429/503, refusals
  counted in ``failed``); the promises above hold. Over ``https://`` the API's
  certificate is checked against the system's CAs, or only ``ssl_cafile`` (when not
  passed, ``STEPSTREAM_API_CAFILE``), hostname included; a CA file that cannot be read
  raises :class:`~stepstream.errors.ConfigError` in the constructor; a certificate
  that is not trusted fails each request's events (counted in ``failed``, never
  retried, never blocking).
- **Errors.** A payload that is not JSON-encodable, an id outside the wire rules, or
  a call on an ended run raises at the call (a bug in the caller, reported where it
  is). A delivery the broker refuses or that times out is counted in
  :attr:`Tracer.failed` and logged (at most every few seconds), never raised into
  the agent. A broker unreachable at start is retried with backoff until close. A
  broker that refuses the connection (authentication, an untrusted certificate, a TLS
  handshake) makes every event queued at that moment failed, with one line naming the
  brokers, mechanism, user and the refusal; it is retried with backoff. A missing ACL
  on the topic fails each delivery (counted in :attr:`Tracer.failed`).
- **Flush.** :meth:`Tracer.flush` waits until every queued event is acknowledged or
  failed; :meth:`Tracer.close` (also on leaving ``with``/``async with`` a tracer, and
  at interpreter shutdown for every tracer still open) flushes with
  ``flush_timeout`` and then stops the sender; what is still unsent then is counted
  as failed.
- **Run end.** Leaving a run's ``with``/``async with`` block ends it: ``completed``,
  or ``failed`` with a failure object ``{type, message}`` when the block raised (the
  exception propagates). A run never entered nor ended (a dead agent) has no
  ``run_end``, exactly like an agent that died.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import ssl
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import msgspec

from stepstream.emitter.http_sender import CAFILE_VARIABLE, TOKEN_VARIABLE, api_tls_context
from stepstream.emitter.run import Run
from stepstream.kafka.connection import KafkaConnection, effective_protocol

__all__ = ["Tracer", "TracerStats"]

log = logging.getLogger("stepstream.emitter")

_WARN_EVERY_SECONDS = 5.0
_STOP_SECONDS = 3.0
_DIAGNOSE_SECONDS = 5.0


class TracerStats(msgspec.Struct, frozen=True):
    """Counters of one tracer: ``queued`` (accepted by a call), ``sent`` (acknowledged
    by the broker), ``dropped`` (refused by a call: queue full or tracer closed),
    ``failed`` (accepted, then refused by the broker, timed out or unsent at close),
    ``pending`` (accepted, not yet sent or failed)."""

    queued: int
    sent: int
    dropped: int
    failed: int
    pending: int


class Tracer:
    """One producer for many runs. Thread-safe; usable from sync code and from any
    asyncio loop (nothing it does blocks a loop, except :meth:`flush`/:meth:`close`,
    whose async forms are :meth:`aflush`/:meth:`aclose`)."""

    def __init__(
        self,
        broker: str | KafkaConnection | None = None,
        topic: str = "stepstream.events",
        *,
        security_protocol: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
        sasl_password_file: str | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        ssl_check_hostname: bool | None = None,
        max_queue: int = 10_000,
        flush_timeout: float = 10.0,
        linger_ms: int = 5,
        request_timeout_ms: int = 30_000,
        clock: Callable[[], datetime] | None = None,
        tee: Callable[[bytes], None] | None = None,
        token: str | None = None,
        batch_events: int = 500,
        batch_bytes: int = 4_194_304,
    ) -> None:
        """``broker``: a :class:`KafkaConnection`, or ``host:port`` / ``kafka://host:port``
        (several: comma-separated; default ``STEPSTREAM_BROKER``, else 127.0.0.1:9092)
        with the security keywords (module docstring); or the API's
        ``http(s)://host[:port]`` with ``token`` (an ``ingest`` token; the API chooses
        the topic; of the Kafka settings only ``ssl_cafile`` applies, as the CA of an
        ``https://`` API). ``batch_events`` / ``batch_bytes``: the
        most one HTTP request carries. ``tee``: called with each accepted event's
        bytes, in queue order (the demo writes them to a file)."""
        if max_queue < 1 or batch_events < 1 or batch_bytes < 1:
            raise ValueError("max_queue, batch_events and batch_bytes must be at least 1")
        security = {
            "security_protocol": security_protocol, "sasl_mechanism": sasl_mechanism,
            "sasl_username": sasl_username, "sasl_password": sasl_password,
            "sasl_password_file": sasl_password_file, "ssl_cafile": ssl_cafile, "ssl_certfile": ssl_certfile,
            "ssl_keyfile": ssl_keyfile, "ssl_check_hostname": ssl_check_hostname,
        }  # fmt: skip
        self.endpoint: str | None = None
        self._token = token
        self._verify: ssl.SSLContext | bool = True
        self.batch_events = batch_events
        self.batch_bytes = batch_bytes
        if isinstance(broker, str) and broker.lower().startswith(("http://", "https://")):
            self._token = token or os.environ.get(TOKEN_VARIABLE) or None
            if not self._token:
                raise ValueError(f"a tracer over HTTP needs token= or {TOKEN_VARIABLE} (an ingest token of the company)")
            if any(value is not None for name, value in security.items() if name != "ssl_cafile"):
                raise ValueError("Kafka security settings do not apply to a tracer over HTTP")
            if broker.lower().startswith("https://"):
                self._verify = api_tls_context(ssl_cafile or os.environ.get(CAFILE_VARIABLE) or None)
            elif ssl_cafile is not None:
                raise ValueError("ssl_cafile applies to an https:// API, not http://")
            self.endpoint = broker.rstrip("/")
            self.kafka: KafkaConnection | None = None
            self.bootstrap = ""
            self._client_kwargs: dict[str, Any] = {}
        else:
            if isinstance(broker, KafkaConnection):
                if any(value is not None for value in security.values()):
                    raise ValueError("pass the security settings inside the KafkaConnection, not beside it")
                self.kafka = broker
            else:
                self.kafka = KafkaConnection.from_env(None, security, brokers=broker)
            self.bootstrap = self.kafka.brokers
            self._client_kwargs = self.kafka.aiokafka_kwargs()  # a bad TLS file raises here, at the caller
        self.topic = topic
        self.max_queue = max_queue
        self.flush_timeout = flush_timeout
        self._linger_ms = linger_ms
        self._request_timeout_ms = request_timeout_ms
        self._clock = clock or (lambda: datetime.now(timezone.utc))
        self._tee = tee
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._queue: deque[tuple[bytes, bytes]] = deque()
        self._queued = self._sent = self._dropped = self._failed = 0
        self._unsettled = 0  # queued or in flight: what the bound counts
        self._closed = False
        self._stopping = False
        self._abandoned = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._loop_ready = threading.Event()
        self._last_warning = 0.0

    # -- runs ---------------------------------------------------------------------

    def run(
        self,
        company_id: str,
        run_id: str | None = None,
        *,
        agent_name: str,
        environment: Any = None,
        metadata: dict[str, Any] | None = None,
        parent_id: str | None = None,
    ) -> Run:
        """A new run (a fresh ``run_id`` unless given). Nothing is sent until the run
        starts: on entering ``with``/``async with``, or :meth:`Run.start`."""
        return Run(
            self,
            company_id,
            run_id or uuid.uuid4().hex,
            agent_name=agent_name,
            environment=environment,
            metadata=metadata,
            parent_id=parent_id,
        )

    # -- counters -------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Events refused at the call because the queue was full (or the tracer closed)."""
        with self._lock:
            return self._dropped

    @property
    def failed(self) -> int:
        """Events accepted, then refused by the broker, timed out, or unsent at close."""
        with self._lock:
            return self._failed

    def stats(self) -> TracerStats:
        with self._lock:
            return TracerStats(self._queued, self._sent, self._dropped, self._failed, self._unsettled)

    # -- sending --------------------------------------------------------------------

    def enqueue(self, key: bytes, value: bytes) -> bool:
        """Queue one encoded event without blocking; False (and counted) when dropped."""
        with self._lock:
            if self._closed or self._unsettled >= self.max_queue:
                self._dropped += 1
                return False
            self._queue.append((key, value))
            self._queued += 1
            self._unsettled += 1
            if self._tee is not None:
                self._tee(value)
        self._ensure_started()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop closed under us: close() counts what is left
                pass
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every accepted event is sent or failed; False on timeout."""
        wait = self.flush_timeout if timeout is None else timeout
        with self._settled:
            return self._settled.wait_for(lambda: self._unsettled == 0, wait)

    async def aflush(self, timeout: float | None = None) -> bool:
        return await asyncio.to_thread(self.flush, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush (at most ``timeout``, default ``flush_timeout``), then stop the sender.
        New events are dropped from now on. Returns whether everything was sent;
        what was not is counted in :attr:`failed`. Idempotent."""
        with self._lock:
            self._closed = True
        flushed = self.flush(timeout)
        with self._lock:
            self._stopping = True
        thread, loop, wake = self._thread, self._loop, self._wake
        if thread is not None and loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass
            thread.join(timeout=5.0)
        with self._lock:
            unsent = self._unsettled
            if unsent:
                self._abandoned = True
                self._failed += unsent
                self._unsettled = 0
                self._queue.clear()
                self._settled.notify_all()
        if unsent:
            log.warning("stepstream tracer closed with %d events unsent (counted as failed)", unsent)
        _live.discard(self)
        return flushed and not unsent

    async def aclose(self, timeout: float | None = None) -> bool:
        return await asyncio.to_thread(self.close, timeout)

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Tracer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the background sender ----------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._thread_main, name="stepstream-tracer", daemon=True)
            self._thread.start()
            _live.add(self)
        _register_exit_hook()
        self._loop_ready.wait(5.0)

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._sender())
        except BaseException:  # noqa: BLE001 - a dead sender must say why, never vanish
            log.exception("stepstream tracer: the sender stopped")
        finally:
            self._loop = None
            self._loop_ready.set()
            loop.close()

    def _take(self, limit: int = 500) -> list[tuple[bytes, bytes]]:
        with self._lock:
            count = min(limit, len(self._queue))
            return [self._queue.popleft() for _ in range(count)]

    def _settle(self, sent: int, failed: int) -> None:
        with self._lock:
            if self._abandoned:  # close() already counted these as failed
                return
            self._sent += sent
            self._failed += failed
            self._unsettled -= sent + failed
            self._settled.notify_all()

    def _fail_queued(self) -> int:
        """Count every queued (not in flight) event as failed; returns how many."""
        with self._lock:
            count = len(self._queue)
            self._queue.clear()
            if not self._abandoned:
                self._failed += count
                self._unsettled -= count
            self._settled.notify_all()
        return count

    def _warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _WARN_EVERY_SECONDS:
            self._last_warning = now
            log.warning(message, *args)

    async def _sender(self) -> None:
        self._wake = wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop_ready.set()
        if self.endpoint is not None:
            from stepstream.emitter.http_sender import send_over_http

            await send_over_http(self, wake)
            return
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import KafkaError

        from stepstream.kafka.preflight import diagnose

        producer: AIOKafkaProducer | None = None
        backoff = 0.1
        try:
            while True:
                if producer is None:
                    if self._stopping:
                        return
                    candidate = AIOKafkaProducer(
                        **self._client_kwargs,
                        acks="all",
                        enable_idempotence=True,
                        linger_ms=self._linger_ms,
                        request_timeout_ms=self._request_timeout_ms,
                        client_id="stepstream-tracer",
                    )
                    # Raises ConfigError, which stops the sender (logged; close counts the rest failed).
                    self.kafka.check_protocol(effective_protocol(candidate), "the tracer's producer")
                    try:
                        await candidate.start()
                    except Exception as exc:  # noqa: BLE001 - KafkaError, or a TLS error aiokafka lets through
                        await candidate.stop()
                        refused = await diagnose(self.kafka, _DIAGNOSE_SECONDS)
                        if refused is not None:
                            # Not transient: what waits now is counted as failed (credentials
                            # may be fixed meanwhile, so later events are tried again).
                            failed = self._fail_queued()
                            self._warn("stepstream tracer: Kafka refused %s: %s (%d events counted as failed); retrying",
                                       self.kafka.describe(), refused, failed)  # fmt: skip
                        else:
                            self._warn("stepstream tracer: broker %s unreachable (%s); retrying", self.bootstrap, type(exc).__name__)
                        await _wait(wake, backoff)
                        wake.clear()
                        backoff = min(backoff * 2, 5.0)
                        continue
                    producer, backoff = candidate, 0.1
                batch = self._take()
                if not batch:
                    if self._stopping:
                        return
                    wake.clear()
                    if not self._queue:
                        await wake.wait()
                    continue
                for key, value in batch:
                    try:
                        delivery = await producer.send(self.topic, value, key=key)
                    except KafkaError as exc:
                        self._settle(0, 1)
                        self._warn("stepstream tracer: send refused (%s)", type(exc).__name__)
                        continue
                    delivery.add_done_callback(self._delivered)
        finally:
            if producer is not None:
                # close() flushed first, so what is still in flight now waits on a broker
                # that does not answer: bounded, and close() counts it as failed.
                try:
                    await asyncio.wait_for(producer.stop(), _STOP_SECONDS)
                except TimeoutError:
                    log.warning("stepstream tracer: the producer did not stop within %.0fs", _STOP_SECONDS)

    def _delivered(self, delivery: asyncio.Future) -> None:
        exc = delivery.exception() if not delivery.cancelled() else asyncio.CancelledError()
        if exc is None:
            self._settle(1, 0)
        else:
            self._settle(0, 1)
            self._warn("stepstream tracer: delivery failed (%s)", type(exc).__name__)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass


_live: weakref.WeakSet[Tracer] = weakref.WeakSet()
_exit_hook = threading.Lock()
_exit_hook_registered = False


def _close_live_tracers() -> None:
    # atexit runs before daemon threads are frozen, so each sender can still deliver.
    for tracer in list(_live):
        tracer.close()


def _register_exit_hook() -> None:
    global _exit_hook_registered
    with _exit_hook:
        if not _exit_hook_registered:
            atexit.register(_close_live_tracers)
            _exit_hook_registered = True
