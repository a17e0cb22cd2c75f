"""Sign-in and sign-out pages (``api.ui.session`` has the rules they follow)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from stepstream.api.tokens import TokenRegistry, TokensUnavailable
from stepstream.api.ui.session import (
    LOGIN_PATH,
    PageUnavailable,
    read_form,
    request_token,
    same_site_post,
    signed_in,
    signed_out,
)

NEXT_MAX_CHARS = 512


def refused() -> Template:
    return Template(
        template_name="error.html",
        status_code=403,
        context={"title": "Refused", "message": "This form was posted from another site; sign in from this page."},
    )


def signin_handlers(registry: TokenRegistry) -> list[Any]:
    @get("/ui", opt={"query": ()})
    async def home(request: Request[Any, Any, Any]) -> Response[Any]:
        token = request_token(request)
        try:
            principal = registry.authenticate(token) if token else None
        except TokensUnavailable as exc:
            raise PageUnavailable() from exc
        if principal is None:
            return Redirect(LOGIN_PATH, status_code=303)
        return Redirect(f"/ui/companies/{principal.company}/runs", status_code=303)

    @get(LOGIN_PATH, opt={"query": ("next",)})
    async def login_form(request: Request[Any, Any, Any]) -> Template:
        next_path = request.query_params.get("next", "")[:NEXT_MAX_CHARS]
        return Template(template_name="login.html", context={"next_path": next_path, "error": None})

    @post(LOGIN_PATH, opt={"query": ()}, status_code=303)
    async def login(request: Request[Any, Any, Any]) -> Response[Any]:
        if not same_site_post(request):
            return refused()
        form = await read_form(request)
        token = (form or {}).get("token", "").strip()
        next_path = (form or {}).get("next", "")[:NEXT_MAX_CHARS]
        try:
            principal = registry.authenticate(token) if token else None
        except TokensUnavailable as exc:
            raise PageUnavailable() from exc
        if principal is None:
            return Template(
                template_name="login.html",
                status_code=401,
                context={"next_path": next_path, "error": "That token is unknown or revoked."},
            )
        return signed_in(principal, token, next_path)

    @post("/ui/logout", opt={"query": ()}, status_code=303)
    async def logout(request: Request[Any, Any, Any]) -> Response[Any]:
        if not same_site_post(request):
            return refused()
        return signed_out()

    return [home, login_form, login, logout]
