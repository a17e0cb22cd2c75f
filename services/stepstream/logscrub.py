"""Every log line scrubbed: no credential reaches a log, whoever logs it.

:func:`install` (called once by the composition root, ``stepstream.cli``) wraps
``logging.Handler.format``, which every handler (ours, faust's, aiokafka's, the
drivers', ``logging.lastResort``) calls to turn a record it emits into text. There,
once per record, its message is
formatted, passed through ``core.redact.scrub`` (credentials masked, clipped to
:data:`LOG_CHARS`) and stored without its arguments (an empty tuple); a record carrying
an exception gets its traceback formatted and scrubbed the same way (clipped to
:data:`TRACE_CHARS`), so a formatter prints that text and never the raw exception. A
MongoDB URL with a password in a connection error shows ``mongodb://app:[redacted]@db``.
The secrets stepstream itself holds (the Kafka SASL password; :func:`add_secrets`) are
replaced by ``[redacted]`` wherever they appear, whatever the text around them, before
that scrub.

Records that no handler emits (a driver's debug chatter, dropped by a level or a
filter) are never formatted nor scrubbed: scrubbing at record creation instead cost
the worker a fifth of its CPU in aiosqlite's per-call debug records. (A handler that
ships records without formatting them, such as ``logging.handlers.SocketHandler``,
is not covered; stepstream installs none.)
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from stepstream.core.redact import scrub

__all__ = ["LOG_CHARS", "TRACE_CHARS", "add_secrets", "install", "scrub_record", "scrub_text"]

LOG_CHARS = 4096
TRACE_CHARS = 16384
REDACTED = "[redacted]"
_MIN_SECRET_CHARS = 4  # shorter values would mask ordinary text; a real password is longer

_secrets: tuple[str, ...] = ()


def add_secrets(values: object) -> None:
    """Mask these literal values in every log line and traceback from now on (the
    composition root passes the Kafka connection's password)."""
    global _secrets
    found = [v for v in values if isinstance(v, str) and len(v) >= _MIN_SECRET_CHARS]  # type: ignore[attr-defined]
    # Longest first, so a secret that contains another is masked whole.
    _secrets = tuple(sorted(set(_secrets) | set(found), key=len, reverse=True))


def scrub_text(text: str, limit: int) -> str:
    """``text`` without the known secrets, then through ``core.redact.scrub``."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return scrub(text, limit)


def scrub_record(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` with its message (and traceback) scrubbed, in place (once)."""
    if getattr(record, "stepstream_scrubbed", False):
        return record
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: logging reports it when it emits
        return record
    record.msg = scrub_text(message, LOG_CHARS)
    record.args = ()  # not None: faust's formatter wraps a non-tuple into one and formats again
    if record.exc_info and record.exc_info[1] is not None:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = scrub_text(text, TRACE_CHARS)
    record.stepstream_scrubbed = True
    return record


def install() -> None:
    """Scrub every record any handler of this process formats from now on (idempotent)."""
    current = logging.Handler.format
    if getattr(current, "stepstream_scrubs", False):
        return

    def format(self: logging.Handler, record: logging.LogRecord) -> str:  # noqa: A001 - the method's name
        return current(self, scrub_record(record))

    format.stepstream_scrubs = True  # type: ignore[attr-defined]
    logging.Handler.format = format  # type: ignore[method-assign]
