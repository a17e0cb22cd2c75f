"""The :class:`~stepstream.emitter.tracer.Tracer`'s sender over HTTP: for a tracer made
with an ``http://`` or ``https://`` URL and a ``token``, the queued events go to the
API's ``POST /v1/companies/{company}/events`` instead of Kafka.

It runs in the tracer's background thread and loop, so the agent's calls never wait
for it. Contracts, beside the tracer's own:

- **Batches.** Up to ``batch_events`` queued events (and at most ``batch_bytes`` of
  them) go in one NDJSON request, cut where the company changes (the route is per
  company), in queue order; a run's events are in one tracer's queue in ``seq``
  order, and each request is sent only after the previous one was answered, so a
  run's events arrive in order.
- **Retries.** A 429, 502, 503 or 504, a timeout or a connection that fails: the same
  request again, after ``Retry-After`` (at most 30 s) or a backoff from 0.1 s doubling
  to 5 s, until it is answered otherwise or the tracer closes (then what is unsent is
  counted in ``failed`` by the tracer). The API skips nothing twice downstream: a
  retried request's events keep their ids and ``seq``.
- **Refusals.** Any other answer than 202 (401, 403, 404, 400, 413, 500): the request's
  events are counted in ``failed`` and a warning names the status, never the token.
  So does an ``https://`` API whose certificate is not trusted (by the system's CAs,
  or by ``ssl_cafile`` only): a trust failure is a setting, not a passing fault, so
  it is not retried; the agent never waits for it.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import TYPE_CHECKING

from stepstream.errors import ConfigError

if TYPE_CHECKING:
    from stepstream.emitter.tracer import Tracer

__all__ = ["CAFILE_VARIABLE", "RETRY_STATUSES", "TOKEN_VARIABLE", "api_tls_context", "send_over_http"]

TOKEN_VARIABLE = "STEPSTREAM_TOKEN"  # the token, when the tracer is not given one
CAFILE_VARIABLE = "STEPSTREAM_API_CAFILE"  # the https API's CA, when ssl_cafile is not given

RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER = 30.0
MAX_BACKOFF = 5.0


def api_tls_context(cafile: str | None) -> ssl.SSLContext:
    """The client TLS context for an ``https://`` API: the system's CAs, or ``cafile``
    only; hostname checked. A file that cannot be used is a :class:`ConfigError`."""
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(f"bad setting: ssl_cafile {cafile!r} cannot be used ({why})") from None


def _untrusted(exc: BaseException) -> bool:
    """``exc`` comes of a certificate the client does not trust."""
    seen: BaseException | None = exc
    for _ in range(10):  # httpx -> httpcore -> ssl
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _company(key: bytes) -> bytes:
    return key.partition(b"/")[0]


def _cut(batch: list[tuple[bytes, bytes]], max_bytes: int) -> int:
    """How many leading events of ``batch`` go in one request: one company, at most
    ``max_bytes`` of lines (always at least one event)."""
    company = _company(batch[0][0])
    size = 0
    for count, (key, value) in enumerate(batch):
        size += len(value) + 1
        if count and (_company(key) != company or size > max_bytes):
            return count
    return len(batch)


def _retry_after(value: str | None, backoff: float) -> float:
    try:
        seconds = float(value) if value is not None else backoff
    except ValueError:
        seconds = backoff
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


async def _pause(tracer: Tracer, seconds: float) -> None:
    """Sleep ``seconds``, or less when the tracer starts stopping."""
    deadline = time.monotonic() + seconds
    while not tracer._stopping and (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left, 0.05))


async def send_over_http(tracer: Tracer, wake: asyncio.Event) -> None:
    """Send the tracer's queue to its API until it stops (module docstring)."""
    import httpx

    headers = {"authorization": f"Bearer {tracer._token}", "content-type": "application/x-ndjson"}
    timeout = httpx.Timeout(tracer._request_timeout_ms / 1000)
    batch: list[tuple[bytes, bytes]] = []
    backoff = 0.1
    async with httpx.AsyncClient(base_url=tracer.endpoint, headers=headers, timeout=timeout,
                                 verify=tracer._verify) as client:  # fmt: skip
        while True:
            if not batch:
                if tracer._stopping:
                    return
                batch = tracer._take(tracer.batch_events)
                if not batch:
                    wake.clear()
                    if not tracer._queue:
                        await wake.wait()
                    continue
            count = _cut(batch, tracer.batch_bytes)
            company = _company(batch[0][0]).decode()
            body = b"\n".join(value for _, value in batch[:count])
            try:
                response = await client.post(f"/v1/companies/{company}/events", content=body)
                status, wait = response.status_code, response.headers.get("retry-after")
            except httpx.HTTPError as exc:
                if _untrusted(exc):
                    tracer._settle(0, count)
                    tracer._warn("stepstream tracer: the API at %s has a certificate this tracer does not trust; "
                                 "%d events failed", tracer.endpoint, count)  # fmt: skip
                    batch = batch[count:]
                    continue
                status, wait = 0, None
                tracer._warn("stepstream tracer: the API at %s did not answer (%s); retrying", tracer.endpoint,
                             type(exc).__name__)  # fmt: skip
            if status == 202:
                tracer._settle(count, 0)
                batch, backoff = batch[count:], 0.1
            elif status == 0 or status in RETRY_STATUSES:
                if status:
                    tracer._warn("stepstream tracer: the API answered %d; retrying", status)
                await _pause(tracer, _retry_after(wait, backoff))
                backoff = min(backoff * 2, MAX_BACKOFF)
                if tracer._stopping:
                    return  # close() counts what is unsent as failed
            else:
                tracer._settle(0, count)
                tracer._warn("stepstream tracer: the API refused %d events with %d", count, status)
                batch = batch[count:]
