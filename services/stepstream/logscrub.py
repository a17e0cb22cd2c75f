"""Every log line scrubbed: no credential reaches a log, whoever logs it.

:func:`install` wraps the process's log record factory (the composition root calls
it once, ``stepstream.cli``): each record's message is formatted at once, passed
through ``core.redact.scrub`` (credentials masked, clipped to :data:`LOG_CHARS`)
and stored without its arguments (an empty tuple); a record carrying an exception gets its
traceback formatted and scrubbed the same way (clipped to :data:`TRACE_CHARS`),
so a formatter prints that text and never the raw exception. This covers our
loggers, faust's, aiokafka's and the drivers' (a MongoDB URL with a password in
a connection error shows ``mongodb://app:[redacted]@db``).
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from stepstream.core.redact import scrub

__all__ = ["LOG_CHARS", "TRACE_CHARS", "install", "scrub_record"]

LOG_CHARS = 4096
TRACE_CHARS = 16384


def scrub_record(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` with its message (and traceback) scrubbed, in place."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: logging reports it when it emits
        return record
    record.msg = scrub(message, LOG_CHARS)
    record.args = ()  # not None: faust's formatter wraps a non-tuple into one and formats again
    if record.exc_info and record.exc_info[1] is not None:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = scrub(text, TRACE_CHARS)
    return record


def install() -> None:
    """Scrub every log record this process creates from now on (idempotent)."""
    current = logging.getLogRecordFactory()
    if getattr(current, "stepstream_scrubs", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return scrub_record(current(*args, **kwargs))

    factory.stepstream_scrubs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
