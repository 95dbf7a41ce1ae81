"""The live dashboard: GET /dashboard (the page), GET /dashboard/data (the last five minutes of
samples, or only those after ``?since=``, with the models and deployments), and
GET /dashboard/static/{name} (the page's script and style from ``titan/dashboard/static``, and
Plotly's bundle from the installed ``plotly`` package: the page loads nothing from elsewhere and
works offline). Open, like /metrics."""

from __future__ import annotations

from importlib import resources
from importlib.util import find_spec
from pathlib import Path

import orjson
from starlette.requests import Request
from starlette.responses import FileResponse, Response

from titan.api.state import pipeline_of
from titan.errors import InvalidRequestError, NotFoundError, ServiceUnavailableError

PAGE_PACKAGE = "titan.dashboard"  # package data only: the page, its script and style
PAGE_ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
PLOTLY_BUNDLE = "plotly.min.js"
# Same-origin only: the browser itself refuses anything from elsewhere. Plotly writes inline
# styles (and <style> elements) as it draws.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
# Revalidate every time (ETag / Last-Modified make that a 304): an upgrade shows at once.
NO_CACHE = {"cache-control": "no-cache"}


def _page_file(name: str) -> Path:
    return Path(str(resources.files(PAGE_PACKAGE).joinpath("static", name)))


def _plotly_bundle() -> Path:
    """plotly.min.js as the ``plotly`` package ships it, found without importing the package."""
    spec = find_spec("plotly")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / "package_data" / PLOTLY_BUNDLE
        if path.is_file():
            return path
    raise ServiceUnavailableError(
        "The dashboard's chart library is missing: install the 'plotly' package."
    )


async def page(request: Request) -> Response:
    pipeline_of(request).dashboard.start()  # sampling starts with the first look
    return FileResponse(
        _page_file("index.html"),
        media_type="text/html; charset=utf-8",
        headers={**NO_CACHE, "content-security-policy": CONTENT_SECURITY_POLICY},
    )


async def data(request: Request) -> Response:
    raw = request.query_params.get("since")
    since = None
    if raw is not None:
        try:
            since = float(raw)
        except ValueError:
            raise InvalidRequestError(
                f"Invalid since={raw!r}: give a sample's time in Unix seconds, e.g. "
                "since=1767225600.5",
                param="since",
            ) from None
    dashboard = pipeline_of(request).dashboard
    dashboard.start()
    payload = dashboard.data(since)
    return Response(
        orjson.dumps(payload), media_type="application/json", headers={"cache-control": "no-store"}
    )


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    if name == PLOTLY_BUNDLE:
        return FileResponse(
            _plotly_bundle(), media_type=PAGE_ASSETS["dashboard.js"], headers=NO_CACHE
        )
    media_type = PAGE_ASSETS.get(name)  # a fixed list: no path from the URL reaches the disk
    if media_type is None:
        raise NotFoundError(f"The dashboard has no file {name!r}.")
    return FileResponse(_page_file(name), media_type=media_type, headers=NO_CACHE)
