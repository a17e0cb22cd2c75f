"""Who may read what: the guard every ``/v1`` route runs before its handler.

Order of the checks, and why:

1. no ``Authorization: Bearer`` header: 401, ``WWW-Authenticate: Bearer realm="stepstream"``;
2. an unknown, malformed or revoked token: 401 with ``error="invalid_token"``;
3. the token's company is not the path's company: 404, the same bytes as a
   missing run (:data:`~stepstream.api.problems.NOT_FOUND`), so a token never
   learns whether another company exists; a route whose ``opt["company"]`` is
   ``"token"`` (``POST /v1/traces``) has no company in its path: the token's company
   is put in ``connection.state.company`` for it instead;
4. the token lacks the route's scope: 403 with ``error="insufficient_scope"``.

The guard runs before path and query parameters are validated, so an anonymous
caller always gets 401, whatever else is wrong with the request. The route's
scope is the handler's ``opt["scope"]``; a ``/v1`` handler without one is a
programming error and is refused (500) rather than served open. ``OPTIONS``
(Litestar's automatic answer: 204 and ``Allow``, no body) needs no token.
"""

from __future__ import annotations

from typing import Any

from stepstream.api.problems import NOT_FOUND, ProblemError, problem
from stepstream.api.tokens import Principal, TokenRegistry, TokensUnavailable

REALM = 'Bearer realm="stepstream"'


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def make_guard(registry: TokenRegistry) -> Any:
    """The Litestar guard for ``registry``; it records the token id in the
    request's ``stepstream`` info for the access log."""

    async def authorize(connection: Any, route_handler: Any) -> None:
        if connection.scope.get("method") == "OPTIONS":
            return  # Litestar's own answer: 204 with Allow, the same for every path; no data
        token = bearer_token(connection.headers.get("authorization"))
        if token is None:
            raise ProblemError(problem(401, "a bearer token is required"), {"WWW-Authenticate": REALM})
        try:
            principal: Principal | None = registry.authenticate(token)
        except TokensUnavailable as exc:
            raise ProblemError(problem(503, "tokens are unavailable"), {"Retry-After": "5"}) from exc
        if principal is None:
            raise ProblemError(
                problem(401, "the token is unknown or revoked"),
                {"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
            )
        info = connection.scope.get("stepstream")
        if info is not None:
            info.token_id = principal.token_id
        if route_handler.opt.get("company") == "token":
            connection.state.company = principal.company  # a route without a company in its path
        elif connection.path_params.get("company") != principal.company:
            raise ProblemError(NOT_FOUND)
        needed = route_handler.opt.get("scope")
        if needed is None:
            raise RuntimeError(f"route {route_handler.handler_name} declares no scope")
        if needed not in principal.scopes:
            raise ProblemError(
                problem(403, f"this route needs the {needed} scope"),
                {"WWW-Authenticate": f'{REALM}, error="insufficient_scope", scope="{needed}"'},
            )

    return authorize
