"""What keeps the dashboard safe to open: credentials, CSRF tokens, response headers.

Credentials. With a token (``auth="..."``, ``JOBRUN_DASHBOARD_TOKEN`` for
``jobrun dashboard``) every request must carry it, either as
``Authorization: Bearer <token>`` (scripts, a proxy that injects it) or as
the password of HTTP basic auth with any user name (what a browser asks a
person for, and then resends by itself, live refreshes included). Anything
else is answered 401 with a basic-auth challenge. The comparison takes the
same time whatever the guess. Without a token the dashboard trusts whoever
can reach it, which is why ``jobrun dashboard`` only serves a loopback
address then (see :mod:`jobrun.web.server`). ``auth`` may also be a
callable judging the request, for an application that mounts the dashboard
behind its own sessions.

CSRF. Every action is a POST carrying a token that a page from this
dashboard put in its form: a random nonce lives in an HttpOnly,
SameSite=Strict cookie scoped to the dashboard's path, and the token is the
HMAC of that nonce under a secret of the app's own. Another site can make a
browser send the cookie (SameSite aside) but can neither read it nor
compute the HMAC, so its forged POST is refused 403. A new secret (a
restart, by default) only means the next POST is refused and the reloaded
page works again.

Hosts. With ``allowed_hosts`` a request naming any other host in its Host
header is refused 400 before anything else. ``jobrun dashboard`` without a
token allows only the loopback names and the address it binds: a web page
that renamed its own host to 127.0.0.1 (DNS rebinding) would otherwise be
same-origin with an open dashboard, able to read its pages and tokens.

Headers. Every response carries a Content-Security-Policy allowing scripts,
styles and images from the dashboard itself only (no inline script, no
inline style, no framing, no form posting elsewhere): even a string that
escaped escaping could not run. Pages are never cached.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import HTTPConnection

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CSRF_COOKIE = "jobrun_csrf"
CSRF_FIELD = "csrf"
REALM = "jobrun dashboard"
MIN_TOKEN_CHARS = 16
"""A shorter dashboard token is refused: it would be guessable."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)

Authorizer = Callable[[HTTPConnection], bool]


def token_matches(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries ``token`` (bearer, or basic-auth password)."""
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        offered = value
    elif scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        _, sep, offered = decoded.partition(":")
        if not sep:
            return False
    else:
        return False
    return hmac.compare_digest(offered.encode("utf-8"), token.encode("utf-8"))


def authorizer(auth: str | Authorizer | None) -> Authorizer | None:
    """The request check for ``create_app(auth=...)``: a token, a callable, or None (open)."""
    if auth is None or callable(auth):
        return auth
    if not isinstance(auth, str):
        raise TypeError(
            f"auth must be a token (str), a callable or None, not {type(auth).__name__}"
        )
    if len(auth) < MIN_TOKEN_CHARS:
        raise ValueError(f"the dashboard token must be at least {MIN_TOKEN_CHARS} characters")
    token = auth

    def check(conn: HTTPConnection) -> bool:
        return token_matches(conn.headers.get("authorization"), token)

    return check


def host_of(header: str) -> str:
    """The host of a Host header, without its port, brackets or case (``[::1]:8080`` -> ``::1``)."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0] if value.count(":") == 1 else value


class Guard:
    """ASGI middleware: the Host check, the credential check, then the security headers on
    every response."""

    def __init__(
        self, app: ASGIApp, check: Authorizer | None, allowed_hosts: frozenset[str] | None = None
    ) -> None:
        self.app = app
        self.check = check
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"cache-control"
                ]
                headers.extend(SECURITY_HEADERS)
                message["headers"] = headers
            await send(message)

        if self.allowed_hosts is not None:
            host = host_of(HTTPConnection(scope).headers.get("host", ""))
            if host not in self.allowed_hosts:
                await _plain(with_headers, send, 400, b"400 Bad Request: unexpected Host header\n")
                return
        if self.check is not None and not self.check(HTTPConnection(scope)):
            body = b"401 Unauthorized: this dashboard needs its token (bearer or basic auth)\n"
            await with_headers(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", f'Basic realm="{REALM}", charset="UTF-8"'.encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, with_headers)


async def _plain(start: Send, send: Send, status: int, body: bytes) -> None:
    await start(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Csrf:
    """Tokens bound to a cookie nonce by an HMAC under this app's secret."""

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret if secret is not None else secrets.token_bytes(32)

    @staticmethod
    def new_nonce() -> str:
        return secrets.token_urlsafe(24)

    def token(self, nonce: str) -> str:
        return hmac.new(self.secret, nonce.encode("utf-8"), hashlib.sha256).hexdigest()

    def valid(self, nonce: str | None, token: str | None) -> bool:
        if not nonce or not token:
            return False
        return hmac.compare_digest(self.token(nonce).encode(), token.encode("utf-8", "replace"))
