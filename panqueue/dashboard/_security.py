"""The dashboard's guard: a signed session cookie per browser, the CSRF token derived from it,
the optional access token (``Authorization: Bearer T`` or the login form's cookie), and the
security headers every response carries.

Nothing here is stored server-side. The session id lives in a cookie signed with the app's
secret (random per app, so a restart logs everyone out); the CSRF token and the login cookie
are HMACs of that id, so neither can be forged without the secret nor replayed on another
session. Every comparison is constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import quote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AUTH_COOKIE", "SESSION_COOKIE", "Guard", "Signer", "route_path"]

SESSION_COOKIE = "panqueue_session"
AUTH_COOKIE = "panqueue_auth"

# No inline script or style anywhere: the one script and the one stylesheet are static files
# of the app, so a payload that slipped past escaping still could not run.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_HEADERS = [
    (b"content-security-policy", _CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
# Pages reachable without the access token: the login form and the static files (a stylesheet
# and a script, no data).
_OPEN_PATHS = ("/login",)
_OPEN_PREFIX = "/static/"


def route_path(scope: Scope) -> str:
    """The request's path inside the app (without the prefix it is mounted under)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root):] or "/"
    return path


class Signer:
    """The app's secret and what it signs: session ids, CSRF tokens, login cookies."""

    def __init__(self, token: str | None) -> None:
        self.secret = secrets.token_bytes(32)
        self.token = token

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self.secret, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def new_session(self) -> tuple[str, str]:
        """A fresh session id and its cookie value."""
        sid = secrets.token_urlsafe(18)
        return sid, f"{sid}.{self._mac('session', sid)}"

    def session_of(self, cookie: str | None) -> str | None:
        """The session id in a cookie value, or None if it is missing or not ours."""
        if not cookie or "." not in cookie:
            return None
        sid, _, mac = cookie.rpartition(".")
        return sid if hmac.compare_digest(mac, self._mac("session", sid)) else None

    def csrf_token(self, sid: str) -> str:
        return self._mac("csrf", sid)

    def csrf_ok(self, sid: str, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(),
                                                         self.csrf_token(sid).encode())

    def login_cookie(self, sid: str) -> str:
        return self._mac("auth", sid)

    def token_ok(self, given: str | None) -> bool:
        """Whether ``given`` is the access token (always False when none is configured)."""
        if self.token is None or given is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())


def _cookies(scope: Scope) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, sep, val = part.strip().partition("=")
                if sep:
                    found.setdefault(key, val)
    return found


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


def cookie_header(scope: Scope, name: str, value: str, *, max_age: int | None = None) -> bytes:
    """A Set-Cookie value: HttpOnly, SameSite=Strict, scoped to the app's path, Secure over
    HTTPS."""
    parts = [f"{name}={value}", f"Path={scope.get('root_path', '') or '/'}", "HttpOnly",
             "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if scope.get("scheme") == "https":
        parts.append("Secure")
    return "; ".join(parts).encode("latin-1")


class Guard:
    """ASGI middleware in front of the dashboard's routes.

    Gives every browser a session (``scope["state"]["session"]``, and whether the request
    carries the access token in ``scope["state"]["authenticated"]``), refuses requests without
    the access token when one is configured (a page: 303 to the login form; anything else:
    401), and adds the security headers to every response.
    """

    def __init__(self, app: ASGIApp, signer: Signer) -> None:
        self.app = app
        self.signer = signer

    def authenticated(self, scope: Scope, sid: str) -> bool:
        if self.signer.token is None:
            return True
        authorization = _header(scope, b"authorization") or ""
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() == "bearer" and self.signer.token_ok(credentials.strip()):
            return True
        cookie = _cookies(scope).get(AUTH_COOKIE)
        return cookie is not None and hmac.compare_digest(
            cookie.encode(), self.signer.login_cookie(sid).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sid = self.signer.session_of(_cookies(scope).get(SESSION_COOKIE))
        new_cookie = None
        if sid is None:
            sid, new_cookie = self.signer.new_session()
        state: MutableMapping[str, Any] = scope.setdefault("state", {})
        state["session"] = sid
        path = route_path(scope)
        static = path.startswith(_OPEN_PREFIX)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers += [(k, v) for k, v in _HEADERS if k not in names]
                if not static and b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                sets_session = any(name.lower() == b"set-cookie"
                                   and value.startswith(SESSION_COOKIE.encode() + b"=")
                                   for name, value in headers)
                if new_cookie is not None and not sets_session:
                    headers.append((b"set-cookie",
                                    cookie_header(scope, SESSION_COOKIE, new_cookie)))
                message = {**message, "headers": headers}
            await send(message)

        # The open pages are served to anyone: what they show depends on this flag.
        state["authenticated"] = self.authenticated(scope, sid)
        if static or path in _OPEN_PATHS or state["authenticated"]:
            await self.app(scope, receive, send_with_headers)
            return
        await self._refuse(scope, path, send_with_headers)

    async def _refuse(self, scope: Scope, path: str, send: Send) -> None:
        """303 to the login form for a page a browser asked for, 401 for anything else."""
        root = scope.get("root_path", "")
        if scope["method"] in ("GET", "HEAD") and not path.startswith("/api/"):
            query = scope.get("query_string", b"").decode("latin-1")
            back = path + (f"?{query}" if query else "")
            location = f"{root}/login?next={quote(back, safe='')}"
            await send({"type": "http.response.start", "status": 303,
                        "headers": [(b"location", location.encode("latin-1")),
                                    (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        body = (b"authentication required: send Authorization: Bearer <token>, "
                b"or log in at " + f"{root}/login".encode("latin-1") + b"\n")
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"www-authenticate", b'Bearer realm="panqueue"'),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
