"""``stepstream api``: open the stores, build the app, serve it with uvicorn."""

from __future__ import annotations

import logging
from pathlib import Path

import uvicorn

from stepstream.api.app import create_app
from stepstream.api.ingest import Ingest, IngestLimits
from stepstream.api.tokens import TokenRegistry
from stepstream.config import Settings
from stepstream.metrics import ApiMetrics, IngestMetrics
from stepstream.sinks import open_deep_store, open_step_store

log = logging.getLogger("stepstream.api")
GRACEFUL_SHUTDOWN_SECONDS = 5


def build_ingest(settings: Settings, metrics: ApiMetrics) -> Ingest:
    """The ingest route's parts from the settings; its Kafka event log is not started."""
    from stepstream.api.kafka_log import KafkaEventLog
    from stepstream.api.kafka_txn_log import TransactionalEventLog
    from stepstream.api.ratelimit import CompanyBuckets
    from stepstream.ingest.dead_letters import max_request_bytes

    if settings.otlp_topic:  # POST /v1/traces decodes otlp_proto: refuse to start without the extra
        from stepstream.errors import ConfigError
        from stepstream.otlp.decode import protobuf_backend

        try:
            protobuf_backend()
        except ImportError as exc:
            raise ConfigError(f"STEPSTREAM_OTLP_TOPIC is set: {exc}") from None
    ingest_metrics = IngestMetrics(metrics.registry)
    bounds = {
        "timeout_seconds": settings.ingest_timeout_seconds,
        "max_inflight_bytes": settings.ingest_max_inflight_bytes,
        "max_request_bytes": max_request_bytes(settings.max_event_bytes),
    }
    event_log: KafkaEventLog | TransactionalEventLog
    if settings.ingest_transactions:
        event_log = TransactionalEventLog(settings.kafka, settings.topic, ingest_metrics,
                                          transactional_id=settings.ingest_transactional_id, **bounds)  # fmt: skip
    else:
        event_log = KafkaEventLog(settings.kafka, settings.topic, ingest_metrics, **bounds)
    limits = IngestLimits(
        max_body_bytes=settings.ingest_max_body_bytes,
        max_events=settings.ingest_max_events,
        max_event_bytes=settings.max_event_bytes,
        max_requests=settings.ingest_max_requests,
    )
    buckets = CompanyBuckets(settings.ingest_rate_events, settings.ingest_burst_events)
    return Ingest(event_log, buckets, limits, ingest_metrics, otlp_topic=settings.otlp_topic)


async def serve(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers), then close the stores (and the
    ingest producer, with ``api_ingest``)."""
    steps = await open_step_store(settings.steps_sink)
    try:
        deep = await open_deep_store(settings.deep)
        try:
            metrics = ApiMetrics()
            ingest = build_ingest(settings, metrics) if settings.api_ingest else None
            app = create_app(
                steps,
                deep,
                TokenRegistry(Path(settings.tokens_file)),
                metrics,
                max_exports=settings.api_max_exports,
                export_wait_seconds=settings.api_export_wait_seconds,
                ingest=ingest,
            )
            config = uvicorn.Config(
                app,
                host=settings.api_host,
                port=settings.api_port,
                log_config=None,
                access_log=False,
                lifespan="on",
                server_header=False,
                # Open live streams (the viewer's tail) must not hold a stop: past this,
                # uvicorn closes the connections that are left.
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
            )
            log.warning(
                "stepstream api on http://%s:%d, the run viewer on http://%s:%d/ui (tokens %s)",
                settings.api_host, settings.api_port, settings.api_host, settings.api_port, settings.tokens_file,
            )  # fmt: skip
            if ingest is not None:
                await ingest.event_log.start()  # type: ignore[attr-defined]
            try:
                await uvicorn.Server(config).serve()
            finally:
                if ingest is not None:
                    await ingest.event_log.close()  # type: ignore[attr-defined]
        finally:
            await deep.close()
    finally:
        await steps.close()


def run_api(settings: Settings) -> int:
    """Serve on uvloop (uvicorn's own choice when it is installed, as it is: a pinned
    dependency), whose event loop costs a fraction of asyncio's per request and per
    produced batch."""
    import uvloop

    uvloop.run(serve(settings))
    return 0
