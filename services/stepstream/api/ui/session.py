"""Who is looking at a viewer page: sign-in, sign-out and the viewer's guard.

The viewer signs in with the tokens that exist (``stepstream token add``): the
sign-in form trades a token for an HttpOnly ``__Host-`` cookie (Secure,
SameSite=Lax, Path=/), so no script ever holds it and the API stays stateless.

**Where the cookie counts.** Only on the viewer's ``GET`` routes (its pages, the
live stream and a step's raw body), which run :func:`make_viewer_guard`: the bearer
header first, then the cookie. The ``/v1`` routes keep their own guard
(``api.auth``), which reads the bearer header alone, so a state change (a purge) can
never ride on a cookie.

**Cross-site posts.** Sign-in and sign-out are the only posts; both refuse a request
a browser marks as cross-site (:func:`same_site_post`): ``Sec-Fetch-Site`` when the
browser sends it (``same-origin`` or ``none`` pass), else an ``Origin`` that is not
this server's. Under ``Referrer-Policy: no-referrer`` Chromium sends ``Origin: null``
on a form post, so ``Origin`` alone would refuse every sign-in; a ``null`` origin
without ``Sec-Fetch-Site`` is refused, since nothing then says where it came from.

**Checks, in order** (the same as ``/v1`` answers, as pages): no token, or a token
that is unknown or revoked: a redirect to the sign-in page (the cookie is cleared);
another company in the path: the viewer's one 404 page, byte for byte the page of a
missing run; a missing scope: 403. The token is checked on every request, so a
revoked token stops working on the next one (the live stream re-checks each tick).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, quote

from litestar import Request, Response
from litestar.response import Redirect

from stepstream.api.auth import bearer_token
from stepstream.api.tokens import Principal, TokenRegistry, TokensUnavailable

COOKIE = "__Host-stepstream"
LOGIN_PATH = "/ui/login"
FORM_MAX_BYTES = 4096  # a token is ~60 characters; the form holds it and a return path
SESSION_SECONDS = 12 * 3600


class SignInRequired(Exception):
    """No valid token: the page answers with a redirect to the sign-in form."""

    def __init__(self, next_path: str) -> None:
        super().__init__("sign-in required")
        self.next_path = next_path


class PageNotFound(Exception):
    """A missing run, another company's run, a path the viewer does not have: one page."""


class PageForbidden(Exception):
    """The token lacks the scope the page needs."""

    def __init__(self, scope: str) -> None:
        super().__init__(scope)
        self.scope = scope


class PageUnavailable(Exception):
    """The tokens file cannot be read: 503, like ``/v1`` (fail closed)."""


def request_token(connection: Any) -> str | None:
    """The bearer token if the request has one, else the sign-in cookie's."""
    return bearer_token(connection.headers.get("authorization")) or connection.cookies.get(COOKIE) or None


def principal_of(connection: Any) -> Principal:
    """The principal the viewer's guard admitted (set on the connection's scope)."""
    principal: Principal = connection.scope["stepstream_principal"]
    return principal


def make_viewer_guard(registry: TokenRegistry) -> Any:
    """The guard of every viewer route but sign-in: see the module docstring. A
    route's scope is its ``opt["scope"]`` (a route without one is refused, as in ``/v1``)."""

    async def authorize(connection: Any, route_handler: Any) -> None:
        token = request_token(connection)
        next_path = connection.scope.get("path", "/ui")
        if token is None:
            raise SignInRequired(next_path)
        try:
            principal = registry.authenticate(token)
        except TokensUnavailable as exc:
            raise PageUnavailable() from exc
        if principal is None:
            raise SignInRequired(next_path)
        info = connection.scope.get("stepstream")
        if info is not None:
            info.token_id = principal.token_id
        company = connection.path_params.get("company")
        if company is not None and company != principal.company:
            raise PageNotFound()
        needed = route_handler.opt.get("scope")
        if needed is None:
            raise RuntimeError(f"viewer route {route_handler.handler_name} declares no scope")
        if needed not in principal.scopes:
            raise PageForbidden(needed)
        connection.scope["stepstream_principal"] = principal
        connection.scope["stepstream_token"] = token

    return authorize


def same_site_post(request: Request[Any, Any, Any]) -> bool:
    """Whether a browser would call this post same-site (module docstring)."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return True  # not a browser's form post (curl, a script): a cookie cannot ride on it
    if origin == "null":
        return False
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


async def read_form(request: Request[Any, Any, Any]) -> dict[str, str] | None:
    """The url-encoded form, at most :data:`FORM_MAX_BYTES`; ``None`` when larger or
    not a form. The first value of each field."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX_BYTES:
            return None
    try:
        fields = parse_qs(body.decode("ascii"), max_num_fields=8)
    except (UnicodeDecodeError, ValueError):
        return None
    return {name: values[0] for name, values in fields.items()}


def safe_next(path: str | None, company: str) -> str:
    """Where to go after sign-in: a viewer path of the token's company, else its runs."""
    default = f"/ui/companies/{company}/runs"
    if not path or not path.startswith(f"/ui/companies/{company}/") or "//" in path or "\\" in path:
        return default
    return path


def signed_in(principal: Principal, token: str, next_path: str | None) -> Response[Any]:
    response: Response[Any] = Redirect(safe_next(next_path, principal.company), status_code=303)
    response.set_cookie(
        COOKIE, token, path="/", secure=True, httponly=True, samesite="lax", max_age=SESSION_SECONDS
    )
    return response


def clear_cookie(response: Response[Any]) -> None:
    # A __Host- cookie is only replaced by one with the same attributes (Secure, Path=/).
    response.set_cookie(COOKIE, "", path="/", secure=True, httponly=True, samesite="lax", max_age=0)


def signed_out() -> Response[Any]:
    response: Response[Any] = Redirect(LOGIN_PATH, status_code=303)
    clear_cookie(response)
    return response


def sign_in_redirect(next_path: str) -> Response[Any]:
    """Where a page without a valid token sends the browser; a stale cookie goes."""
    response: Response[Any] = Redirect(f"{LOGIN_PATH}?next={quote(next_path, safe='/')}", status_code=303)
    clear_cookie(response)
    return response
