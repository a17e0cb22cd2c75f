"""The log scrub (``stepstream.logscrub.install``): every record a handler takes is
scrubbed once; a record no handler takes is never formatted."""

from __future__ import annotations

import logging

from stepstream.logscrub import install

SECRET = "sk-proj-" + "Q" * 32


class Captured(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class Counted:
    """An argument that counts how often it is formatted."""

    def __init__(self) -> None:
        self.formatted = 0

    def __str__(self) -> str:
        self.formatted += 1
        return "token=" + SECRET


def test_taken_records_are_scrubbed_and_records_below_every_handler_are_never_formatted():
    install()
    install()  # idempotent
    logger = logging.getLogger("stepstream.test.logscrub")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)  # as a driver's logger may be: records are created
    first, second = Captured(logging.INFO), Captured(logging.WARNING)
    logger.addHandler(first)
    logger.addHandler(second)
    try:
        quiet = Counted()
        logger.debug("debug %s", quiet)
        assert quiet.formatted == 0 and first.lines == [] == second.lines

        loud = Counted()
        logger.warning("calling %s with %s", "https://admin:hunter2pass@db.internal/x", loud)
        assert loud.formatted == 1  # scrubbed once, for both handlers
        assert len(first.lines) == len(second.lines) == 1 and first.lines == second.lines
        assert SECRET not in first.lines[0] and "hunter2pass" not in first.lines[0]
        assert "[redacted]" in first.lines[0]

        try:
            raise ValueError("boom " + SECRET)
        except ValueError:
            logger.exception("failed")
        assert all(SECRET not in line for line in first.lines) and "ValueError" in first.lines[-1]
    finally:
        logger.removeHandler(first)
        logger.removeHandler(second)
