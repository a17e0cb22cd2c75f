"""Which company and which run an OTLP span belongs to (``docs/otel.md``, "Identity").

Company, most trusted first:

1. the ``stepstream-company`` Kafka header of the message (set by our own endpoint, or
   by the Collector's ``record_headers`` / ``include_metadata_keys``);
2. the resource attribute ``stepstream.company_id``, only when
   :attr:`IdentityPolicy.trust_resource_company` is on (``STEPSTREAM_OTLP_TRUST_RESOURCE_COMPANY``:
   anyone who can write to the topic can then name any company);
3. :attr:`IdentityPolicy.default_company` (``STEPSTREAM_OTLP_COMPANY``, a default for
   the topic);

otherwise the span is refused as ``no_company``. A company that is not a valid
``company_id`` (``[A-Za-z0-9._-]{1,64}``) is ``bad_company``: it is never "repaired".

Run: the span's ``stepstream.run_id`` attribute, else the resource's, else the trace id
(32 hex digits). A run id is resolved per span, statelessly, so a ``stepstream.run_id``
must be on every span of the trace (a resource attribute, or a span processor that copies
it from baggage); a span without one lands in the trace id's run. An invalid one is
``bad_run_id``.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from stepstream.core.wire import COMPANY_ID_PATTERN, RUN_ID_PATTERN
from stepstream.errors import WireError
from stepstream.otlp.spans import Span

__all__ = ["COMPANY_HEADER", "IdentityPolicy", "company_of", "run_of"]

COMPANY_HEADER = "stepstream-company"
RESOURCE_COMPANY = "stepstream.company_id"
RUN_ATTRIBUTE = "stepstream.run_id"

_company = re.compile(COMPANY_ID_PATTERN)
_run = re.compile(RUN_ID_PATTERN)


class IdentityPolicy(msgspec.Struct, frozen=True):
    trust_resource_company: bool = False
    default_company: str | None = None


def header_company(headers: Any) -> str | None:
    """The ``stepstream-company`` header's value (the last one, as Kafka clients read a
    repeated header), or ``None``."""
    found: str | None = None
    for key, value in headers or ():
        if key == COMPANY_HEADER and value is not None:
            found = bytes(value).decode("utf-8", "replace")
    return found


def company_of(header: str | None, resource: dict[str, Any], policy: IdentityPolicy) -> str:
    """The company of the spans of one resource (module docstring); raises ``WireError``."""
    company: Any = header
    if company is None and policy.trust_resource_company:
        company = resource.get(RESOURCE_COMPANY)
    if company is None:
        company = policy.default_company
    if company is None:
        raise WireError("no_company", "no stepstream-company header, trusted resource attribute or topic default")
    if type(company) is not str or _company.match(company) is None:
        raise WireError("bad_company", "the company is not [A-Za-z0-9._-]{1,64}")
    return company


def run_of(span: Span) -> str:
    """The run of ``span`` (module docstring); raises ``WireError`` (``bad_run_id``)."""
    run = span.attributes.get(RUN_ATTRIBUTE)
    if run is None:
        run = span.resource.get(RUN_ATTRIBUTE)
    if run is None:
        return span.trace_id
    if type(run) is not str or _run.match(run) is None:
        raise WireError("bad_run_id", "stepstream.run_id is not [A-Za-z0-9._:-]{1,128}")
    return run
