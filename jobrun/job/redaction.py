"""Passwords out of free text: driver messages, handlers' exceptions, log lines.

One redactor for all of jobrun. :func:`redact` finds what looks like a
connection string inside any text and masks its password with ``***``:

- a URL with a scheme and a userinfo, any scheme (``postgresql://``,
  ``postgresql+psycopg://``, ``mysql://``, ...): ``user:PASSWORD@host``.
  The *last* ``@`` before the host ends the userinfo, so a raw ``@`` in a
  password is masked too; a password holding a raw ``/``, ``?``, ``#`` or
  spaces (not valid URL syntax, but pasted all the same) is masked up to
  the ``@`` that follows it, and with no ``@`` in sight, to the end of the line;
- ``password=VALUE`` (also ``sslpassword``, ``PGPASSWORD``, ``passwd``,
  ``pwd``, ``...secret``, libpq's ``scram_client_key`` and
  ``scram_server_key``; any case), where VALUE follows libpq's key=value rules: a
  single-quoted value runs to the closing quote (``\\'`` escapes one) and
  an unterminated one to the end of the line; an unquoted value runs to the
  next blank (``&`` or ``#`` too inside a URL's query);
- ``'password': 'VALUE'`` and ``"password": "VALUE"``, as a dict or JSON
  prints a connection's parameters.

Callers that know the secret itself (the DSN they were given) pass it as
``known`` too, which masks it wherever it appears, in whatever message.

Text with no ``://`` and none of the key words costs one regular-expression
scan: this runs on every failed job.

Pure Python, no driver: the domain may use it (jobrun/postgres adds the
libpq parsing, see :mod:`jobrun.postgres.dsn`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

MASK = "***"

_TRIGGER = re.compile(r"://|passw|pwd|secret|scram_", re.IGNORECASE)

_CANDIDATE = re.compile(
    r"(?P<scheme>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*)://"
    r"|(?<![\w.-])(?P<quote>[\"']?)"
    r"(?P<key>[\w.-]*?(?:password|passwd|secret)|pwd|scram_(?:client|server)_key)(?P=quote)"
    r"\s*(?P<sep>[=:])[ \t]*",
    re.IGNORECASE,
)
_BLANK = re.compile(r"\s")
_AUTHORITY_END = re.compile(r"[/?#\s]")
_QUERY_START = re.compile(r"[?#\s]")
_URL_VALUE_END = re.compile(r"[\s&#]")
# host[:port][,host[:port]]...: what an authority without a userinfo looks like.
_HOSTS = re.compile(
    r"(?:\[[^\]]*\]|[^:,\[\]]*)(?::[0-9]*)?(?:,(?:\[[^\]]*\]|[^:,\[\]]*)(?::[0-9]*)?)*"
)


def _find(pattern: re.Pattern[str], text: str, start: int, end: int) -> int:
    match = pattern.search(text, start, end)
    return end if match is None else match.start()


def url_userinfo(text: str, start: int) -> tuple[int, int, bool]:
    """Where the userinfo of a URL whose authority begins at ``start`` (after ``://``) ends.

    Returns ``(at, url_end, unterminated)``: ``at`` is the index of the
    ``@`` that ends the userinfo (-1: none), ``url_end`` where the URL's run
    of non-blank characters ends (a password with blanks pushes it on), and
    ``unterminated`` says a password seems to begin (``user:pa ss`` with no
    ``@`` after it), so the rest of the line may be secret.
    """
    line_end = text.find("\n", start)
    if line_end < 0:
        line_end = len(text)
    token_end = _find(_BLANK, text, start, line_end)
    authority_end = _find(_AUTHORITY_END, text, start, token_end)
    at = text.rfind("@", start, authority_end)
    if at >= 0:
        return at, token_end, False
    # host:port has digits after the colon; anything else there is a password
    # holding a raw '/', '?', '#' or blank (or a garbled URL: masked all the same).
    broken = _HOSTS.fullmatch(text, start, authority_end) is None
    limit = token_end if broken else _find(_QUERY_START, text, authority_end, token_end)
    at = text.rfind("@", authority_end, limit)
    if at >= 0 or not broken:
        return at, token_end, False
    at = text.rfind("@", token_end, line_end)
    if at >= 0:
        return at, _find(_BLANK, text, at, line_end), False
    return -1, line_end, text.find(":", start, authority_end) >= 0


def url_password(text: str, start: int) -> tuple[tuple[int, int] | None, int]:
    """The password of a URL whose authority begins at ``start``: ``(span or None, url_end)``."""
    at, url_end, unterminated = url_userinfo(text, start)
    if unterminated:
        return (text.find(":", start, url_end) + 1, url_end), url_end
    colon = text.find(":", start, at) if at >= 0 else -1
    if colon < 0 or colon + 1 == at:
        return None, url_end
    return (colon + 1, at), url_end


def _quoted_end(text: str, start: int, quote: str) -> int:
    """Index of the quote closing a value opened just before ``start`` (libpq's escapes)."""
    index = start
    while True:
        close = text.find(quote, index)
        if close < 0:
            line_end = text.find("\n", start)
            return len(text) if line_end < 0 else line_end
        backslashes = 0
        before = close - 1
        while before >= start and text[before] == "\\":
            backslashes += 1
            before -= 1
        if backslashes % 2 == 0:
            return close
        index = close + 1


def _unquoted_end(text: str, start: int, in_url: bool) -> int:
    if in_url:
        return _find(_URL_VALUE_END, text, start, len(text))
    index = start
    length = len(text)
    while index < length and not text[index].isspace():
        index += 2 if text[index] == "\\" else 1
    return min(index, length)


def secret_spans(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` of every password found in ``text``, in order, not overlapping."""
    spans: list[tuple[int, int]] = []
    if not _TRIGGER.search(text):
        return spans
    index = 0
    url_end = -1  # end of the URL the scan is inside (its query may hold password=)
    while True:
        match = _CANDIDATE.search(text, index)
        if match is None:
            return spans
        if match.group("scheme"):
            span, url_end = url_password(text, match.end())
            if span is None:
                index = match.end()
            else:
                spans.append(span)
                index = span[1]
            continue
        if match.group("sep") == ":" and not match.group("quote"):
            index = match.end()  # "password: ..." in prose, not a parameter
            continue
        begin = match.end()
        if begin < len(text) and text[begin] in "'\"":
            start, end = begin + 1, _quoted_end(text, begin + 1, text[begin])
        else:
            start, end = begin, _unquoted_end(text, begin, match.start() < url_end)
        if end > start:
            spans.append((start, end))
        index = max(end, match.end())


def redact(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every password in it replaced by ``***`` (see the module docs).

    ``known``: secrets the caller holds (a DSN's password), masked wherever
    they appear.
    """
    for secret in known:
        if secret and secret != MASK:
            text = text.replace(secret, MASK)
    spans = secret_spans(text)
    if not spans:
        return text
    out: list[str] = []
    position = 0
    for start, end in spans:
        out.append(text[position:start])
        out.append(MASK)
        position = end
    out.append(text[position:])
    return "".join(out)


class RedactingFormatter(logging.Formatter):
    """A log formatter whose every line (message, traceback, stack) goes through :func:`redact`.

    ``known`` is read at each record, so secrets learned after logging was
    configured (the DSN, once resolved) can be added to it.
    """

    def __init__(self, fmt: str | None = None, *, known: Iterable[str] = ()) -> None:
        super().__init__(fmt)
        self.known = known

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), self.known)
