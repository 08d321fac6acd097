"""``GET /docs``: Swagger UI over ``/openapi.json``, under a strict Content-Security-Policy.

The page shares its origin with the dashboard (``/ui/``), whose bearer token is in the
origin's sessionStorage: any script the page runs could read it. No well-kept PyPI package
ships Swagger UI's files (FastAPI and Starlette do not), so the page still loads them from
the jsDelivr CDN, but only the two files of one pinned release, each with a Subresource
Integrity digest: a browser refuses a file the CDN alters, so the only scripts the page can
run are that release's bundle and the page's own few lines (allowed by their SHA-256 in the
policy, not by ``'unsafe-inline'``). The policy also keeps the page from calling anything but
its own origin (``connect-src 'self'``), from loading images other than its own or ``data:``,
from being framed, and from posting forms.

To move to another Swagger UI release: ``npm pack swagger-ui-dist@<version>``, then, for
``swagger-ui-bundle.js`` and ``swagger-ui.css`` of the package,
``openssl dgst -sha384 -binary <file> | base64`` gives the digests below (prefixed ``sha384-``).
"""

from __future__ import annotations

import base64
import hashlib
import html

from fastapi import APIRouter
from starlette.responses import Response

SWAGGER_UI_VERSION = "5.35.0"
_CDN = f"https://cdn.jsdelivr.net/npm/swagger-ui-dist@{SWAGGER_UI_VERSION}"
SWAGGER_JS_URL = f"{_CDN}/swagger-ui-bundle.js"
SWAGGER_JS_SRI = "sha384-gjRm0bEPMeTmMh5jT2cHccIwCUZSTd8YC+j0d0sXw0MdGEfScduGpSyF3ZSSLkX9"
SWAGGER_CSS_URL = f"{_CDN}/swagger-ui.css"
SWAGGER_CSS_SRI = "sha384-WlYgdmXYOOBWL5apwjDEZwN+U3HmXSSu5R6V5aGxEcf7z+KuRNwBhoxKVN1i3D5I"

#: the page's one inline script; the policy allows it by its digest
_INIT = """
SwaggerUIBundle({
  url: "/openapi.json", dom_id: "#swagger-ui", layout: "BaseLayout", deepLinking: true,
  showExtensions: true, showCommonExtensions: true,
  validatorUrl: null, persistAuthorization: false,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
"""


def _script_digest(source: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode()


#: styles: the pinned sheet, and the style attributes Swagger UI's React components set
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'",
    f"script-src {SWAGGER_JS_URL} '{_script_digest(_INIT)}'",
    f"style-src {SWAGGER_CSS_URL} 'unsafe-inline'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
))

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}


def docs_page(title: str) -> bytes:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{html.escape(title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{SWAGGER_CSS_URL}"
      integrity="{SWAGGER_CSS_SRI}" crossorigin="anonymous">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{SWAGGER_JS_URL}" integrity="{SWAGGER_JS_SRI}" crossorigin="anonymous"></script>
<script>{_INIT}</script>
</body>
</html>
""".encode()


def add_routes(router: APIRouter, title: str) -> None:
    page = docs_page(title)

    @router.get("/docs", include_in_schema=False)
    async def swagger_ui() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=_HEADERS)
