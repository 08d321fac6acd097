"""The dashboard's page: ``GET /ui/`` and its script and style, files of api/ui/ served by
hourglass itself (nothing is fetched from elsewhere at run time). The page holds no data: it
signs in with a bearer token (kept in sessionStorage) and calls the v1 API like any client.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import RedirectResponse, Response

from storage.errors import NotFound

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
#: the page may load only its own files and call only its own origin
_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                       "frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def _load() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type) of every asset, read once at start-up."""
    return {p.name: (p.read_bytes(), _TYPES[p.suffix]) for p in sorted(UI_DIR.iterdir())
            if p.suffix in _TYPES}


def add_routes(router: APIRouter) -> None:
    assets = _load()

    @router.get("/ui", include_in_schema=False)
    async def ui_root() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @router.get("/ui/", include_in_schema=False)
    async def ui_index() -> Response:
        return _asset(assets, "index.html")

    @router.get("/ui/{name}", include_in_schema=False)
    async def ui_asset(name: str) -> Response:
        return _asset(assets, name)


def _asset(assets: dict[str, tuple[bytes, str]], name: str) -> Response:
    found = assets.get(name)
    if found is None:
        raise NotFound(f"no dashboard file {name!r}")
    body, media_type = found
    return Response(body, media_type=media_type, headers=_HEADERS)
