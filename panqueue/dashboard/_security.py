"""The dashboard's guard: the Host every request names and the Origin every action comes from,
a signed session cookie per browser, the CSRF token derived from it, the optional access token
(``Authorization: Bearer T`` or the login form's cookie), and the security headers every
response carries.

Nothing here is stored server-side. The session id lives in a cookie signed with the app's
secret (random per app, so a restart logs everyone out); the CSRF token and the login cookie
are HMACs of that id, so neither can be forged without the secret nor replayed on another
session. Every comparison is constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Iterable, MutableMapping
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AUTH_COOKIE", "LOGIN_MAX_AGE", "SESSION_COOKIE", "Guard", "Signer", "host_names",
           "route_path"]

SESSION_COOKIE = "panqueue_session"
AUTH_COOKIE = "panqueue_auth"
# How long a login lasts: its cookie carries when it was issued, under the MAC.
LOGIN_MAX_AGE = 12 * 3600

# No inline script or style anywhere: the one script and the one stylesheet are static files
# of the app, so a payload that slipped past escaping still could not run.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_HEADERS = [
    (b"content-security-policy", _CSP.encode()),
    (b"x-frame-options", b"DENY"),
    # Not "no-referrer": under it a browser sends "Origin: null" with the dashboard's own
    # forms, and an action is known to come from the dashboard by its Origin.
    (b"referrer-policy", b"same-origin"),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
# Pages reachable without the access token: the login form and the static files (a stylesheet
# and a script, no data).
_OPEN_PATHS = ("/login",)
_OPEN_PREFIX = "/static/"


# Methods that only read; any other is an action, which must come from a page of the dashboard.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: A host name and its port (None: the scheme's default), as a Host header or an allowed
#: host names them.
Authority = tuple[str, int | None]


def _authority(value: str) -> Authority | None:
    """The lower-case name (an IPv6 address without its brackets) and port of a Host header's
    value or an origin's ``host[:port]``; None if it is not that alone (a user, a path, ...)."""
    if not value or any(c in value for c in "/\\?#@ \t"):
        return None
    try:
        parts = urlsplit("//" + value)
        port = parts.port
    except ValueError:  # a port that is no number, a bracket left open
        return None
    return None if not parts.hostname else (parts.hostname, port)


def host_names(entries: Iterable[str]) -> tuple[Authority, ...]:
    """The names (``dash.example``, ``dash.example:8443``) a dashboard answers to besides the
    address it serves. Raises ValueError naming an entry that is not a host name."""
    if isinstance(entries, str):
        entries = [entries]
    found = []
    for entry in entries:
        authority = _authority(entry) if isinstance(entry, str) else None
        if authority is None:
            raise ValueError(f"{entry!r} is not a host name (a name or an address, with an "
                             f"optional :port, as in 'dash.example' or 'dash.example:8443')")
        found.append(authority)
    return tuple(found)


def _served(scope: Scope) -> tuple[str, int] | None:
    """The address the request arrived at (ASGI's ``server``), its port filled in; None if
    the server gives none, or a unix socket's path."""
    server = scope.get("server")
    if not server or not server[0] or str(server[0]).startswith("/"):
        return None
    default = 443 if scope.get("scheme") == "https" else 80
    return str(server[0]).strip("[]").lower(), int(server[1] or default)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _shown(name: str, port: int) -> str:
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


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
        # Sessions logged out of, until their logins would have lapsed anyway: a copy of
        # their cookies, taken before, logs in no more.
        self._ended: dict[str, float] = {}

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
        """The login of session ``sid``, from now for :data:`LOGIN_MAX_AGE` seconds."""
        issued = str(int(time.time()))
        return f"{issued}.{self._mac('auth', f'{sid}:{issued}')}"

    def login_ok(self, sid: str, cookie: str) -> bool:
        """Whether ``cookie`` is a login of session ``sid`` that has not lapsed nor ended."""
        issued, _, mac = cookie.partition(".")
        if not issued.isdigit() or not hmac.compare_digest(
                mac.encode(), self._mac("auth", f"{sid}:{issued}").encode()):
            return False
        now = time.time()
        return now - int(issued) < LOGIN_MAX_AGE and sid not in self._ended

    def end(self, sid: str) -> None:
        """Log session ``sid`` out for good (its cookies, wherever they were copied)."""
        now = time.time()
        self._ended = {s: t for s, t in self._ended.items() if now - t < LOGIN_MAX_AGE}
        self._ended[sid] = now

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


async def _plain(send: Send, status: int, text: str) -> None:
    """A short text response, with the security headers."""
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"), *_HEADERS]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware in front of the dashboard's routes.

    Refuses a request whose Host is not a name of the dashboard (421), and an action whose
    Origin is not the dashboard (403); gives every browser a session
    (``scope["state"]["session"]``, and whether the request carries the access token in
    ``scope["state"]["authenticated"]``), refuses requests without the access token when one
    is configured (a page: 303 to the login form; anything else: 401), and adds the security
    headers to every response.

    The Host check is what stops DNS rebinding: a page of a name its owner points at
    127.0.0.1 is, to the browser, of the same origin as the dashboard on loopback, so neither
    the same-origin policy nor SameSite cookies keep it from reading pages and sending forms.
    Its requests name that host, though: only the address served (its IP and port, or
    localhost on loopback) and the names configured with ``allowed_hosts`` are answered.
    """

    def __init__(self, app: ASGIApp, signer: Signer,
                 allowed_hosts: tuple[Authority, ...] = ()) -> None:
        self.app = app
        self.signer = signer
        self.allowed_hosts = allowed_hosts

    def _serves(self, scope: Scope, host: Authority) -> bool:
        """Whether the Host ``host`` names this dashboard: an allowed name (with its port, if
        the entry gives one), or the address the request arrived at, by its IP or, on
        loopback, as localhost, and with its port."""
        name, given_port = host
        port = given_port or (443 if scope.get("scheme") == "https" else 80)
        if any(name == allowed and allowed_port in (None, port)
               for allowed, allowed_port in self.allowed_hosts):
            return True
        served = _served(scope)
        if served is None:  # behind a unix socket: the proxy in front owns the names
            return not self.allowed_hosts
        address, served_port = served
        if port != served_port:
            return False
        return name == address or (name == "localhost" and _is_loopback(address))

    def _misdirected(self, scope: Scope) -> str | None:
        """Why the request's Host is not this dashboard, or None if it is."""
        given = _header(scope, b"host") or ""
        host = _authority(given)
        if host is not None and self._serves(scope, host):
            return None
        served = _served(scope)
        if served is None:
            serves = "only the names given with --allowed-host or create_app(allowed_hosts=)"
        else:
            serves = _shown(*served)
            if _is_loopback(served[0]):
                serves += f" and {_shown('localhost', served[1])}"
        return (f"this dashboard does not serve the host {given!r} (it serves {serves}; "
                f"name another host with --allowed-host NAME, or "
                f"create_app(allowed_hosts=[NAME]))\n")

    def _foreign(self, scope: Scope) -> str | None:
        """Why an action does not come from a page of the dashboard, or None if it does: its
        Origin (else its Referer, which older browsers send instead) must name the host the
        request was sent to, which :meth:`_misdirected` checked. A request that carries
        neither is refused too: every browser sends one of them with a form."""
        host = _authority(_header(scope, b"host") or "")
        origin, header = _header(scope, b"origin"), "Origin"
        if origin is None:
            origin, header = _header(scope, b"referer"), "Referer"
        if origin is None:
            return "the request carries no Origin or Referer header"
        try:
            parts = urlsplit(origin)
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or \
                _authority(parts.netloc) != host:
            return f"its {header} {origin!r} is not this dashboard's"
        return None

    def authenticated(self, scope: Scope, sid: str) -> bool:
        if self.signer.token is None:
            return True
        authorization = _header(scope, b"authorization") or ""
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() == "bearer" and self.signer.token_ok(credentials.strip()):
            return True
        cookie = _cookies(scope).get(AUTH_COOKIE)
        return cookie is not None and self.signer.login_ok(sid, cookie)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        misdirected = self._misdirected(scope)
        if misdirected is not None:
            await _plain(send, 421, misdirected)
            return
        if scope["method"] not in _SAFE_METHODS:
            foreign = self._foreign(scope)
            if foreign is not None:
                await _plain(send, 403, "an action must come from a page of this dashboard: "
                             f"{foreign}\n")
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
