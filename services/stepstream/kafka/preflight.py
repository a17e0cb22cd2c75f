"""What the brokers refuse, said in one line, before a service starts.

aiokafka's bootstrap logs why a connection failed and raises a bare "Unable to
bootstrap"; :func:`diagnose` opens one connection itself to learn the reason (a failed
SASL authentication, an untrusted or mismatched certificate, a TLS handshake the broker
refused, a listener that speaks another protocol). :func:`preflight` adds the ACLs a
role needs (DESCRIBE on its topics, which any READ or WRITE grant implies, and on its
group) and raises :class:`~stepstream.errors.KafkaRefused` with one line naming the
brokers, the protocol and mechanism, the principal and what was refused. The worker,
the compactor and the CLI's Kafka commands call it first; the SDK calls
:func:`diagnose` when its producer cannot start, to count refused events as failed.

A broker that does not answer at all is not a refusal (it may be starting): that is
left to each client's own retry policy. No message holds a password or key.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable

from stepstream.errors import KafkaRefused
from stepstream.kafka.connection import KafkaConnection, effective_protocol

__all__ = ["diagnose", "preflight"]

TOPIC_AUTHORIZATION_FAILED = 29
_REQUEST_MS = 10_000


async def diagnose(kafka: KafkaConnection, timeout: float = 10.0) -> str | None:
    """What the first broker that answers refuses, or ``None`` when it accepts the
    connection (or when none answers within ``timeout``)."""
    from aiokafka import errors
    from aiokafka.conn import create_conn

    kwargs = kafka.aiokafka_kwargs()
    kwargs.pop("bootstrap_servers")
    for address in kafka.brokers.split(","):
        host, _, port = address.rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host.strip("[]"), int(port), request_timeout_ms=_REQUEST_MS, **kwargs), timeout
            )
        except errors.SaslAuthenticationFailed:
            return "authentication failed (wrong password or unknown user)"
        except errors.UnsupportedSaslMechanismError:
            return f"SASL mechanism {kafka.sasl_mechanism} is not enabled on this listener"
        except ssl.SSLCertVerificationError as exc:
            return f"the broker's certificate is not trusted ({exc.verify_message or 'verification failed'})"
        except ssl.SSLError as exc:
            return f"the TLS handshake was refused ({exc.reason or type(exc).__name__}; a client certificate missing?)"
        except errors.KafkaConnectionError:
            return (
                "the broker closed the connection during the handshake (a listener of another protocol, "
                "or one that requires a client certificate)"
            )
        except (OSError, TimeoutError):
            continue  # not answering: the next one, or no verdict
        conn.close()
        return None
    return None


async def preflight(
    kafka: KafkaConnection, *, topics: Iterable[str] = (), group: str | None = None, timeout: float = 20.0
) -> None:
    """Raise :class:`KafkaRefused` when the brokers refuse this connection or the
    principal has no access to ``topics`` or ``group``; return otherwise (also when no
    broker answers). Bounded by about ``timeout`` seconds."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    refused = await diagnose(kafka, timeout / 2)
    if refused is not None:
        raise KafkaRefused(f"Kafka refused {kafka.describe()}: {refused}")
    names = list(topics)
    if not names and group is None:
        return
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs(), request_timeout_ms=_REQUEST_MS, client_id="stepstream-preflight")
    kafka.check_protocol(effective_protocol(admin), "the preflight admin client")
    try:
        try:
            await asyncio.wait_for(admin.start(), timeout / 2)
        except (KafkaError, TimeoutError):
            return  # not answering now (diagnose accepted it): the client's own retries decide
        if names:
            described = await asyncio.wait_for(admin.describe_topics(names), timeout / 2)
            denied = [d["topic"] for d in described if d["error_code"] == TOPIC_AUTHORIZATION_FAILED]
            if denied:
                raise KafkaRefused(
                    f"Kafka refused {kafka.describe()}: not authorized on topic {', '.join(denied)} (missing ACL)"
                )
        if group is not None:
            await _check_group(kafka, admin, group, timeout / 2)
    finally:
        await admin.close()


async def _check_group(kafka: KafkaConnection, admin: object, group: str, timeout: float) -> None:
    from aiokafka.errors import GroupAuthorizationFailedError, GroupCoordinatorNotAvailableError

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            await asyncio.wait_for(admin.list_consumer_group_offsets(group), timeout)  # type: ignore[attr-defined]
            return
        except GroupAuthorizationFailedError:
            raise KafkaRefused(f"Kafka refused {kafka.describe()}: not authorized on group {group} (missing ACL)") from None
        except GroupCoordinatorNotAvailableError:
            # A fresh cluster still making its offsets topic: no verdict yet.
            if loop.time() > deadline:
                return
            await asyncio.sleep(0.5)
