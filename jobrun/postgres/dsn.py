"""Connection strings as users paste them, made into what libpq accepts, never printed.

Accepted (``DATABASE_URL``, ``--database-url``, every function taking a DSN):

- libpq URLs, ``postgresql://user:password@host:port/dbname?param=value``
  and ``postgres://...``;
- SQLAlchemy's URLs, as Flask and FastAPI applications keep them:
  ``postgresql+psycopg://``, ``postgresql+psycopg2://``,
  ``postgresql+asyncpg://`` (its ``?ssl=`` becomes libpq's ``sslmode``),
  ``postgresql+psycopg_async://``, ``postgresql+pg8000://``,
  ``postgresql+psycopg2cffi://``;
- libpq key=value strings, ``host=db user=app password='a b\\' c' dbname=app``.

In a URL the last ``@`` before the host ends the userinfo, and a userinfo
libpq would refuse or misread (a raw ``@``, ``/``, blank or a lone ``%`` in
the password) is percent-encoded on the way, as SQLAlchemy reads it. Any
other scheme (``mysql://``) is refused by name.

Errors never carry the password: a string libpq cannot parse is reported
without the fragments libpq quotes from it (only the parameter names it
uses survive), and driver messages lose every secret of the DSN (its
``password``, ``sslpassword``, ...) wherever they appear, then go through
:func:`jobrun.job.redaction.redact`.
"""

from __future__ import annotations

import functools
import re
import urllib.parse

import psycopg
import psycopg.conninfo
from psycopg import pq

from jobrun.job.errors import ValidationError
from jobrun.job.redaction import redact, secret_spans, url_userinfo

FIELD = "DATABASE_URL"

SQLALCHEMY_DRIVERS = frozenset(
    {"psycopg", "psycopg2", "psycopg2cffi", "psycopg_async", "asyncpg", "pg8000"}
)
"""The ``postgresql+<driver>://`` forms accepted: SQLAlchemy's PostgreSQL dialects."""

SECRET_PARAMETERS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
"""libpq parameters whose values are secrets."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# A userinfo part libpq reads as it is: unreserved, sub-delims and %XX escapes.
_CLEAN_USERINFO_PART = re.compile(r"(?:[A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*")
_QUOTED = re.compile(r'"([^"]*)"')
_ASYNCPG_SSL = {
    "true": "require",
    "1": "require",
    "on": "require",
    "false": "disable",
    "0": "disable",
    "off": "disable",
}


def normalize(conninfo: str) -> str:
    """``conninfo`` in a form libpq reads as the user meant it (see the module docs).

    A key=value string, and a URL libpq already reads right, come back
    unchanged. Raises ValidationError (without the password) for a URL of
    another scheme.
    """
    if not isinstance(conninfo, str):
        raise ValidationError(FIELD, f"must be a str, not {type(conninfo).__name__}")
    text = conninfo.strip()
    match = _SCHEME.match(text)
    if match is None:
        return conninfo
    scheme = match.group(1).lower()
    base, plus, driver = scheme.partition("+")
    if base not in ("postgresql", "postgres") or (plus and driver not in SQLALCHEMY_DRIVERS):
        raise ValidationError(
            FIELD,
            f"{scheme}:// is not a PostgreSQL URL (use postgresql://user:password@host:port/dbname,"
            " postgresql+psycopg://..., or a key=value string)",
        )
    start = match.end()
    at, _, _ = url_userinfo(text, start)
    rest = text[at + 1 :] if at >= 0 else text[start:]
    userinfo = _clean_userinfo(text[start:at]) if at >= 0 else None
    if driver == "asyncpg":
        rest = _asyncpg_query(rest)
    unchanged = rest == (text[at + 1 :] if at >= 0 else text[start:])
    if not plus and unchanged and (userinfo is None or userinfo == text[start:at]):
        return text  # already what libpq reads right
    return "postgresql://" + (f"{userinfo}@" if userinfo is not None else "") + rest


def _clean_userinfo(userinfo: str) -> str:
    user, colon, password = userinfo.partition(":")
    if _CLEAN_USERINFO_PART.fullmatch(user) and (
        not colon or _CLEAN_USERINFO_PART.fullmatch(password)
    ):
        return userinfo
    # SQLAlchemy's reading: percent-decode (a lone '%' stays as it is), then encode all.
    parts = [urllib.parse.quote(urllib.parse.unquote(user), safe="")]
    if colon:
        parts.append(urllib.parse.quote(urllib.parse.unquote(password), safe=""))
    return ":".join(parts)


def _asyncpg_query(rest: str) -> str:
    """asyncpg's ``ssl=`` parameter as libpq's ``sslmode=``."""
    path, question, query = rest.partition("?")
    if not question:
        return rest
    query, hash_, fragment = query.partition("#")
    params = query.split("&")
    if any(p.startswith("sslmode=") for p in params):
        return rest
    for index, param in enumerate(params):
        key, _, value = param.partition("=")
        if key == "ssl":
            mode = urllib.parse.unquote(value).lower()
            params[index] = "sslmode=" + _ASYNCPG_SSL.get(mode, mode)
    return f"{path}?{'&'.join(params)}{hash_}{fragment}"


def parse(conninfo: str) -> dict[str, str]:
    """The parameters of ``conninfo`` (normalised); ValidationError without the password."""
    text = normalize(conninfo)
    try:
        return {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(text).items()}
    except psycopg.ProgrammingError as exc:
        failure = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    # Raised outside the except block: no chained driver error carries the string.
    raise ValidationError(
        FIELD, f"invalid connection string: {parse_failure(conninfo, failure)}"
    ) from None


def parse_failure(conninfo: str, message: str) -> str:
    """libpq's message about an unparseable ``conninfo``, without what it quotes from it.

    libpq quotes pieces of the string (the whole URL, a percent-escape, a
    value with blanks), any of which may be the password. What survives:
    libpq's parameter names, the names the string itself uses as
    parameters (``bogus=1``: ``"bogus"``) and lone punctuation (``"="``).
    """
    keys = _used_keys(conninfo)

    def elide(match: re.Match[str]) -> str:
        quoted = match.group(1)
        if quoted in _keywords() or quoted in keys or (len(quoted) == 1 and not quoted.isalnum()):
            return match.group(0)
        return '"…"'

    return redact(_QUOTED.sub(elide, message), secrets(conninfo)) or "unparseable"


def _used_keys(conninfo: str) -> set[str]:
    names = re.findall(r"(?:^|[\s?&])([A-Za-z_][A-Za-z0-9_]*)\s*=", conninfo)
    return {n for n in names if n.lower() not in SECRET_PARAMETERS and not _looks_secret(n)}


def _looks_secret(name: str) -> bool:
    return bool(secret_spans(f"{name}=x"))


@functools.cache
def _keywords() -> frozenset[str]:
    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


def secrets(conninfo: str) -> list[str]:
    """Every secret ``conninfo`` holds, as written in it and as decoded (longest first)."""
    found: set[str] = set()
    for start, end in secret_spans(conninfo):
        raw = conninfo[start:end]
        found.update((raw, raw.strip("'\""), urllib.parse.unquote(raw)))
    try:
        params = psycopg.conninfo.conninfo_to_dict(normalize(conninfo))
    except (psycopg.ProgrammingError, ValidationError):
        params = {}
    found.update(str(v) for k, v in params.items() if k in SECRET_PARAMETERS)
    found.discard("")
    return sorted(found, key=len, reverse=True)


def redact_for(conninfo: str, text: str) -> str:
    """``text`` (a driver's message about ``conninfo``) without any of its secrets."""
    return redact(text, secrets(conninfo))


def redacted(conninfo: str) -> str:
    """``conninfo`` itself with its secrets masked, for reprs."""
    return redact_for(conninfo, conninfo)


def describe(conninfo: str) -> str:
    """A password-free description of where ``conninfo`` points, for messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(normalize(conninfo))
    except (psycopg.ProgrammingError, ValidationError):
        return "<unparseable connection string>"
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    user = params.get("user") or "?"
    dbname = params.get("dbname") or user
    return redact(f"{user}@{host}:{port}/{dbname}", secrets(conninfo))
