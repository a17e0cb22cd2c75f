"""Kafka plumbing below ``ingest/`` and ``emitter/``: the connection value every client
is built from (``connection``) and topic administration (``topics``). Neither imports
the faust worker, so the SDK side can use both.

Import :class:`KafkaConnection` from here or from ``stepstream.kafka.connection``;
``ensure_topics`` from ``stepstream.kafka.topics``."""

from __future__ import annotations

from stepstream.kafka.connection import KafkaConnection, as_connection

__all__ = ["KafkaConnection", "as_connection"]
