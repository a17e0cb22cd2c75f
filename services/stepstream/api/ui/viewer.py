"""The viewer's composition: its routers, error pages and template engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from jinja2 import Environment, FileSystemLoader, select_autoescape
from litestar import Request, Response, Router
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Template
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from stepstream.api.exports import ExportSlots
from stepstream.api.problems import ProblemError
from stepstream.api.tokens import TokenRegistry
from stepstream.api.ui.live import LiveSettings, live_router
from stepstream.api.ui.pages import pages_router
from stepstream.api.ui.raw import raw_router
from stepstream.api.ui.session import (
    PageForbidden,
    PageNotFound,
    PageUnavailable,
    SignInRequired,
    make_viewer_guard,
    sign_in_redirect,
)
from stepstream.api.ui.signin import signin_handlers
from stepstream.sinks.ports import DeepStore, StepStore

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

# One page for a missing run, another company's run and any id no run can have:
# rendered without any per-request value, so its bytes never tell them apart.
NOT_FOUND_CONTEXT = {"title": "Not found", "message": "There is no such page, or no such run in your company."}


def _not_found(_: Request[Any, Any, Any], __: Exception) -> Response[Any]:
    return Template(template_name="error.html", status_code=404, context=NOT_FOUND_CONTEXT)


def _forbidden(_: Request[Any, Any, Any], exc: PageForbidden) -> Response[Any]:
    message = f"Your token lacks the {exc.scope} scope this page needs."
    return Template(template_name="error.html", status_code=403, context={"title": "Not allowed", "message": message})


def _unavailable(_: Request[Any, Any, Any], __: Exception) -> Response[Any]:
    return Template(
        template_name="error.html",
        status_code=503,
        headers={"Retry-After": "5"},
        context={
            "title": "Unavailable",
            "message": "The viewer cannot check tokens, or is at its bound of live streams; try again shortly.",
        },
    )


def _problem(_: Request[Any, Any, Any], exc: ProblemError) -> Response[Any]:
    if exc.body.status == 404:
        return _not_found(_, exc)
    context = {"title": exc.body.title, "message": exc.body.detail}
    return Template(template_name="error.html", status_code=exc.body.status, headers=exc.headers, context=context)


def _sign_in(_: Request[Any, Any, Any], exc: SignInRequired) -> Response[Any]:
    return sign_in_redirect(exc.next_path)


class Viewer(NamedTuple):
    router: Router
    template_config: TemplateConfig[JinjaTemplateEngine]


def viewer(
    steps: StepStore, deep: DeepStore, registry: TokenRegistry, slots: ExportSlots, live: LiveSettings | None = None
) -> Viewer:
    guards = [make_viewer_guard(registry)]
    environment = Environment(
        loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True, default_for_string=True)
    )
    static = create_static_files_router(
        path="/ui/static", directories=[STATIC], include_in_schema=False, opt={"query": ()}, send_as_attachment=False
    )
    router = Router(
        "/",
        route_handlers=[
            *signin_handlers(registry),
            pages_router(steps, guards),
            live_router(steps, registry, guards, live or LiveSettings()),
            raw_router(deep, steps, guards, slots),
            static,
        ],
        exception_handlers={
            SignInRequired: _sign_in,
            PageNotFound: _not_found,
            PageForbidden: _forbidden,
            PageUnavailable: _unavailable,
            ProblemError: _problem,
        },
        include_in_schema=False,
    )
    return Viewer(router, TemplateConfig(instance=JinjaTemplateEngine.from_environment(environment)))
