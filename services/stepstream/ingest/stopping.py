"""A deadline on the part of a worker's stop that no longer matters for the data.

Once SIGTERM's last batch is written and its offsets committed, what faust still does
(leave the consumer group, stop the web server and the producer) is courtesy. Parts of
it can wait far longer than any orchestrator's grace period: aiokafka's consumer stop
first waits for a JoinGroup in flight, which the broker answers only when every member
has rejoined or its session has expired (a paused or slow member: up to the session
timeout), and a commit to a coordinator that does not answer is retried without end.
:class:`StopDeadline` bounds that: past ``seconds`` it logs what was still stopping
and ends the process with status 0 (nothing durable is lost: the next owner of the
partitions reads from the committed offset).

It is a thread, not a task: the event loop may be the thing that is stuck.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class StopDeadline:
    """Exit the process ``seconds`` after :meth:`arm` unless it ended by itself.
    ``describe`` names what is still stopping (called on the timer thread, read only)."""

    def __init__(self, seconds: float, describe: Callable[[], str], exit: Callable[[int], object] = os._exit) -> None:
        self.seconds = seconds
        self._describe = describe
        self._exit = exit
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        if self._timer is not None or self.seconds <= 0:
            return
        self._timer = threading.Timer(self.seconds, self._expire)
        self._timer.name = "stepstream-stop-deadline"
        self._timer.daemon = True  # never keeps a process alive that ended by itself
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        try:
            what = self._describe()
        except Exception as exc:  # noqa: BLE001 - the exit must happen whatever the description does
            what = f"(could not tell: {exc!r})"
        log.warning(
            "stopping: the last batch is written and committed, but the rest of the stop did not end within "
            "%.0fs (still stopping: %s); exiting now",
            self.seconds,
            what,
        )
        flush_logs()
        self._exit(0)


def flush_logs() -> None:
    """Flush every root log handler and stderr, on the way out of ``os._exit``."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
    sys.stderr.flush()


def stopping_services(root: object) -> list[str]:
    """The labels of the mode services under ``root`` (itself included) that began to
    stop and have not finished, deepest first: the first one is what the stop waits for."""
    out: list[str] = []

    def walk(service: object) -> None:
        for child in list(getattr(service, "_children", ())):
            walk(child)
        if getattr(service, "state", None) == "stopping":
            out.append(str(getattr(service, "shortlabel", type(service).__name__)))

    walk(root)
    return out


def waiting_threads() -> list[str]:
    """Names of the threads other than this one and the main thread that keep the
    process alive (not daemons): what the interpreter waits for once faust closed
    its event loop."""
    here = threading.current_thread()
    main = threading.main_thread()
    return [t.name for t in threading.enumerate() if t is not here and t is not main and not t.daemon]
