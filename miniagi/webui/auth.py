"""The UI's lock: it can start runs, so it answers only whoever holds its token.

- The token is made at start, held in this process's memory only (never written to a file, never put in the
  environment of the runs it starts: code a run executes cannot read it), and printed once, in the URL
  (`http://127.0.0.1:PORT/?token=…`, as Jupyter does).
- Opening that URL sets a cookie (HttpOnly: no script reads it; SameSite=Strict: another site's page does not send
  it) and redirects to the same page without the token in its address. A script may send it as
  `Authorization: Bearer TOKEN` instead.
- Any request without it is answered 401: pages, the API, the live event stream, the static files.
- An action is a POST, and a POST that another page could have made is refused with 403: its Origin (or
  Sec-Fetch-Site) must say it came from this UI's own pages, and a form must carry the page's CSRF field (a
  page on another port of 127.0.0.1 is the same *site*, so the cookie alone would go with its POST).
"""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse

SAFE_METHODS = ("GET", "HEAD")
CSRF_FIELD = "csrf"
# every answer: no page of another origin may frame the UI (a click on Approve under a decoy), and the pages run
# only the UI's own scripts, send forms only to it, and tell no other site their address (Referer)
HEADERS = [(b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'; "
                                        b"base-uri 'none'; object-src 'none'"),
           (b"x-frame-options", b"DENY"), (b"referrer-policy", b"same-origin"), (b"x-content-type-options", b"nosniff")]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_value(token: str) -> str:
    """The value every form of the UI carries: derived from the token, so it is known only to its pages."""
    return hmac.new(token.encode(), b"miniagi-ui-form", hashlib.sha256).hexdigest()


def cookie_name(scope) -> str:
    """One cookie per port: two UIs on one machine share a cookie jar (cookies ignore the port)."""
    server = scope.get("server") or ("", 0)
    return f"miniagi_ui_{server[1] or 0}"


def _same(given: str, token: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


class TokenCheck:
    """Lets through only requests that hold the token (cookie, ?token= or a Bearer header); refuses POSTs another
    origin could have sent. Sets `scope["state"]["by_cookie"]`: a form POST made with the cookie must also carry
    the CSRF field (checked where the form is read, `checked_form`)."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        inner = send

        async def send(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await inner(message)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        cookies = SimpleCookie()
        try:
            cookies.load(headers.get("cookie", ""))
        except Exception:  # a malformed Cookie header holds no token
            pass
        cookie = cookies.get(cookie_name(scope))
        bearer = headers.get("authorization", "")
        bearer = bearer[7:].strip() if bearer.lower().startswith("bearer ") else ""
        method = scope.get("method", "GET")
        if "token" in query and method in SAFE_METHODS:
            if not _same(query["token"], self.token):
                return await refuse(401, "wrong token: open the URL `miniagi ui` printed", scope, receive, send)
            rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
            target = scope.get("path", "/") + (f"?{rest}" if rest else "")
            if headers.get("sec-fetch-site") == "cross-site":  # from the page `ui --open` hands the browser (a
                # file): a redirect goes on as that navigation, which a SameSite=Strict cookie is not sent with;
                # a page of the UI's own moves on from here
                response = HTMLResponse(f'<!doctype html><meta http-equiv="refresh" content="0;url='
                                        f'{html.escape(target, quote=True)}">')
            else:
                response = RedirectResponse(target, status_code=303)
            response.set_cookie(cookie_name(scope), self.token, httponly=True, samesite="strict", path="/")
            return await response(scope, receive, send)
        by_cookie = cookie is not None and _same(cookie.value, self.token)
        if not (by_cookie or _same(bearer, self.token)):
            return await refuse(401, "this UI needs its token: open the URL `miniagi ui` printed (…/?token=…), or "
                                "send Authorization: Bearer TOKEN", scope, receive, send)
        if method not in SAFE_METHODS:
            problem = cross_origin(headers, scope)
            if problem:
                return await refuse(403, problem, scope, receive, send)
        scope.setdefault("state", {})["by_cookie"] = by_cookie and not _same(bearer, self.token)
        return await self.app(scope, receive, send)


def cross_origin(headers: dict[str, str], scope) -> str:
    """Why a POST may have come from another origin's page, or "" when it came from this UI's."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"refused: this action came from another site's page (Sec-Fetch-Site: {site})"
    origin = headers.get("origin")
    if origin is not None:
        scheme = scope.get("scheme", "http")
        if origin.lower() != f"{scheme}://{headers.get('host', '')}".lower():
            return f"refused: this action came from a page of another origin ({origin})"
    return ""


async def checked_form(request, token: str):
    """The POSTed form, when it carries the CSRF field of the UI's pages (or the request came with the Bearer
    header); else None (the caller answers 403)."""
    form = await request.form()
    if request.scope.get("state", {}).get("by_cookie", True) and not _same(str(form.get(CSRF_FIELD, "")),
                                                                           csrf_value(token)):
        return None
    return form


async def refuse(status: int, text: str, scope, receive, send):
    response = PlainTextResponse(text, status_code=status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="miniagi ui"'
    return await response(scope, receive, send)
