"""``stepstream api``: open the stores, build the app, serve it with uvicorn."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import uvicorn

from stepstream.api.app import create_app
from stepstream.api.tokens import TokenRegistry
from stepstream.config import Settings
from stepstream.metrics import ApiMetrics
from stepstream.sinks import open_deep_store, open_step_store

log = logging.getLogger("stepstream.api")
GRACEFUL_SHUTDOWN_SECONDS = 5


async def serve(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers), then close the stores."""
    steps = await open_step_store(settings.steps_sink)
    try:
        deep = await open_deep_store(settings.deep)
        try:
            app = create_app(
                steps,
                deep,
                TokenRegistry(Path(settings.tokens_file)),
                ApiMetrics(),
                max_exports=settings.api_max_exports,
                export_wait_seconds=settings.api_export_wait_seconds,
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
            await uvicorn.Server(config).serve()
        finally:
            await deep.close()
    finally:
        await steps.close()


def run_api(settings: Settings) -> int:
    asyncio.run(serve(settings))
    return 0
