"""``stepstream compactor``: passes in a loop (or ``--once``), metrics and health.

The service never waits on the worker and the worker never waits on it. It serves
``/metrics`` (Prometheus text) and ``/healthz`` (JSON: passes, last success) on
``compactor_web_port``. SIGTERM or SIGINT stops it after the stage in progress
(exit 0). ``--once`` runs one pass and exits 0, or 1 if a stage failed. Failing to
open a store or to read the retention file exits 2 before any pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stepstream.compactor.passes import Compactor
from stepstream.compactor.policy import CompanyPolicy, RetentionPolicy, load_policy
from stepstream.config import Settings
from stepstream.core import wire
from stepstream.kafka.connection import KafkaConnection
from stepstream.metrics import Metrics
from stepstream.sinks import open_deep_store, open_step_store

log = logging.getLogger(__name__)


class KafkaPublisher:
    """Publishes ``run_close`` events with the agents' producer settings
    (``acks=all``, idempotent), started on first use."""

    def __init__(self, kafka: KafkaConnection, topic: str) -> None:
        self._kafka = kafka
        self._topic = topic
        self._emitter: Any = None

    async def publish(self, event: wire.RunClose) -> None:
        if self._emitter is None:
            from stepstream.emitter.producer import Emitter

            emitter = Emitter(self._kafka, self._topic)
            await emitter.__aenter__()
            self._emitter = emitter
        await self._emitter.emit(event)

    async def close(self) -> None:
        if self._emitter is not None:
            emitter, self._emitter = self._emitter, None
            await emitter.__aexit__(None, None, None)


def policy_from(settings: Settings) -> RetentionPolicy:
    """The policy from settings (flags, ``STEPSTREAM_*``) and the overrides file."""
    base = CompanyPolicy(
        deep_runs=settings.deep_runs_per_company,
        deep_ttl_seconds=settings.deep_ttl_seconds,
        step_ttl_seconds=settings.step_ttl_seconds,
        abandon_after_seconds=settings.abandon_after_seconds,
    )
    return load_policy(base, settings.retention_file or None)


async def _serve(compactor: Compactor, metrics: Metrics, host: str, port: int) -> web.AppRunner:
    async def metrics_page(request: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health_page(request: web.Request) -> web.Response:
        return web.json_response(
            {"ok": True, "time": time.time(), "passes": compactor.passes, "last_success": compactor.last_success}
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/healthz", health_page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def run_compactor(settings: Settings, *, once: bool = False, metrics: Metrics | None = None) -> int:
    """The service (module docstring); returns the exit status."""
    metrics = metrics or Metrics()
    policy = policy_from(settings)
    # Its run_close events go to the raw topic: a refused connection or ACL is one line now.
    from stepstream.kafka.preflight import preflight

    await preflight(settings.kafka, topics=(settings.topic,))
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    compactor: Compactor | None = None

    def on_signal() -> None:
        log.warning("compactor: stopping after the stage in progress")
        if compactor is not None:
            compactor.stop()
        wake.set()

    # Before the stores open (that takes a moment): a stop meanwhile is a clean exit.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        steps = await open_step_store(settings.steps_sink)
        try:
            deep = await open_deep_store(settings.deep)
        except BaseException:
            await steps.close()
            raise
    except BaseException:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        raise
    if settings.fault_plan:  # chaos tests only (sinks/faults.py)
        from stepstream.sinks.faults import wrap_stores

        steps, deep = wrap_stores(steps, deep, settings.fault_plan)
    publisher = KafkaPublisher(settings.kafka, settings.topic)
    compactor = Compactor(steps, deep, policy, metrics=metrics, publisher=publisher)
    if wake.is_set():
        compactor.stop()
    runner = None
    try:
        if once:
            report = await compactor.run_pass()
            log.warning("compactor: one pass: %s", report)
            return 0 if report.ok or (report.stopped and not report.errors) else 1
        runner = await _serve(compactor, metrics, settings.web_host, settings.compactor_web_port)
        log.warning(
            "compactor: every %gs on %s / %s, /metrics and /healthz on %s:%d",
            settings.compactor_interval_seconds, settings.steps_sink, settings.deep,
            settings.web_host, settings.compactor_web_port,
        )  # fmt: skip
        while not compactor.stopping:
            report = await compactor.run_pass()
            if report.errors:
                log.warning("compactor: pass ended with %d failed stages", len(report.errors))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=settings.compactor_interval_seconds)
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if runner is not None:
            await runner.cleanup()
        await publisher.close()
        await steps.close()
        await deep.close()
