"""One decoded export request to the wire events of its runs.

:func:`map_spans` resolves each span's company (per resource: :mod:`identity`) and
run, and maps it (:mod:`mapping`). Spans it cannot place are :class:`Rejected` with a
named reason (``no_company``, ``bad_company``, ``bad_run_id``, or a wire bound); the
request's other spans are kept. :func:`runs_of` groups the events by run and numbers
each run by :func:`~stepstream.otlp.mapping.order_trace`.

Both are pure functions of the spans, so a request redelivered, split differently or
merged with others gives the same events (``tests/unit/test_otlp_mapping.py`` checks
it with hypothesis).
"""

from __future__ import annotations

from typing import Any

import msgspec

from stepstream.core import wire
from stepstream.errors import WireError
from stepstream.otlp.decode import Rejected
from stepstream.otlp.identity import IdentityPolicy, company_of, run_of
from stepstream.otlp.mapping import order_trace, span_records, trace_order
from stepstream.otlp.spans import Span

__all__ = ["Mapped", "encoded_runs", "map_spans", "runs_of"]


class Mapped(msgspec.Struct):
    """``(role, span_id, event)`` of every span placed, and what was not; ``encoded``
    holds each event's wire bytes (``seq`` 0) by event id, for :func:`encoded_runs`."""

    events: list[tuple[str, str, Any]]
    rejected: list[Rejected]
    encoded: dict[str, bytes] = {}


def map_spans(spans: list[Span], header: str | None, policy: IdentityPolicy, max_event_bytes: int | None = None) -> Mapped:
    events: list[tuple[str, str, Any]] = []
    rejected: list[Rejected] = []
    encoded: dict[str, bytes] = {}
    companies: dict[int, str | WireError] = {}  # per resource (the spans of one share its dict)
    for span in spans:
        key = id(span.resource)
        company = companies.get(key)
        if company is None:
            try:
                company = company_of(header, span.resource, policy)
            except WireError as exc:
                company = exc
            companies[key] = company
        if isinstance(company, WireError):
            rejected.append(Rejected(company.reason, company.detail))
            continue
        try:
            run = run_of(span)
        except WireError as exc:
            rejected.append(Rejected(exc.reason, exc.detail))
            continue
        records, refused = span_records(span, company, run, max_event_bytes)
        rejected.extend(refused)
        span_id = span.span_id
        for role, event, data in records:
            events.append((role, span_id, event))
            encoded[event.event_id] = data  # the last of an id, as order_trace keeps
    return Mapped(events, rejected, encoded)


def runs_of(events: list[tuple[str, str, Any]]) -> dict[tuple[str, str], list[wire.Event]]:
    """The events of each ``(company_id, run_id)``, de-duplicated and numbered."""
    return {key: order_trace(items) for key, items in _grouped(events).items()}


def encoded_runs(mapped: Mapped) -> dict[tuple[str, str], list[bytes]]:
    """:func:`runs_of` as wire bytes (the same bytes ``encode_event`` gives of its events),
    from the bytes the mapping checked: each event is encoded once."""
    encoded = mapped.encoded
    return {
        key: [wire.renumbered(encoded[event.event_id], seq) for seq, event in enumerate(trace_order(items))]
        for key, items in _grouped(mapped.events).items()
    }


def _grouped(events: list[tuple[str, str, Any]]) -> dict[tuple[str, str], list[tuple[str, str, Any]]]:
    grouped: dict[tuple[str, str], list[tuple[str, str, Any]]] = {}
    for item in events:
        event = item[2]
        grouped.setdefault((event.company_id, event.run_id), []).append(item)
    return grouped
