"""Errors as RFC 9457 problem details (``application/problem+json``).

Each problem has a stable ``type`` (a URN, never a link), a fixed ``title`` per
type and a ``detail`` that never quotes a token, a company or a run id, so two
answers of one type and detail are byte-identical. That is how a run of another
company answers exactly like a missing run: both are :data:`NOT_FOUND`.

=====================================  ======  ==========================================
type                                   status  when
=====================================  ======  ==========================================
``urn:stepstream:problem:bad-request``  400    a parameter is invalid (limit, cursor, id)
``urn:stepstream:problem:unauthorized`` 401    no token, an unknown or a revoked token
``urn:stepstream:problem:forbidden``    403    the token lacks the route's scope
``urn:stepstream:problem:not-found``    404    no such run, another company's run or path,
                                               no such route
``urn:stepstream:problem:method-not-allowed`` 405  the route exists, the method does not
``urn:stepstream:problem:gone``         410    a run's bodies were pruned or purged: no bundle
``urn:stepstream:problem:too-large``    413    an ingest body or its event count is over the bound
``urn:stepstream:problem:unsupported-media-type`` 415  an ingest body of another media type
``urn:stepstream:problem:too-many-requests`` 429  the company's ingest rate is exhausted
                                               (``Retry-After`` is set)
``urn:stepstream:problem:unavailable``  503    a store or the tokens file is unavailable
                                               (``Retry-After`` is set)
``urn:stepstream:problem:internal``     500    anything else (logged with its traceback)
=====================================  ======  ==========================================
"""

from __future__ import annotations

import msgspec

PROBLEM_MEDIA_TYPE = "application/problem+json"
PREFIX = "urn:stepstream:problem:"


class Problem(msgspec.Struct, kw_only=True):
    """An RFC 9457 problem details object."""

    type: str
    title: str
    status: int
    detail: str


TITLES = {
    400: ("bad-request", "Bad Request"),
    401: ("unauthorized", "Unauthorized"),
    403: ("forbidden", "Forbidden"),
    404: ("not-found", "Not Found"),
    405: ("method-not-allowed", "Method Not Allowed"),
    410: ("gone", "Gone"),
    413: ("too-large", "Content Too Large"),
    415: ("unsupported-media-type", "Unsupported Media Type"),
    429: ("too-many-requests", "Too Many Requests"),
    503: ("unavailable", "Service Unavailable"),
    500: ("internal", "Internal Server Error"),
}


def problem(status: int, detail: str) -> Problem:
    name, title = TITLES.get(status, TITLES[500] if status >= 500 else TITLES[400])
    return Problem(type=PREFIX + name, title=title, status=status, detail=detail)


class ProblemError(Exception):
    """Raised by handlers and guards; the app turns it into the problem response
    (``content``: the encoded body when it has extension members, else ``body``'s)."""

    def __init__(self, body: Problem, headers: dict[str, str] | None = None, *, content: bytes | None = None) -> None:
        super().__init__(body.detail)
        self.body = body
        self.headers = headers or {}
        self.content = content


NOT_FOUND = problem(404, "not found")
_encoder = msgspec.json.Encoder()


def encode(body: Problem) -> bytes:
    return _encoder.encode(body)


_DESCRIPTIONS = {
    400: "A parameter is invalid (limit, cursor or id)",
    401: "No token, or an unknown or revoked token (see WWW-Authenticate)",
    403: "The token lacks this route's scope",
    404: "No such run, or a run or path of another company (the same bytes)",
    410: "The run's bodies were pruned or purged: no complete bundle",
    413: "The body, or its number of events, is over the route's bound",
    415: "The body is neither application/x-ndjson nor application/json",
    429: "The company's event rate is exhausted; retry after Retry-After seconds",
    503: "A store or the tokens file is unavailable; retry after Retry-After seconds",
}


def problem_responses(*statuses: int) -> dict[int, object]:
    """OpenAPI response entries (``ResponseSpec``) for these problem statuses."""
    from litestar.openapi.datastructures import ResponseSpec

    return {
        status: ResponseSpec(
            data_container=Problem, media_type=PROBLEM_MEDIA_TYPE, description=_DESCRIPTIONS[status],
            generate_examples=False,
        )
        for status in statuses
    }


GUARDED = (401, 403, 404, 503)
