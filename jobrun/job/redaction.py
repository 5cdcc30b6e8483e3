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
import string
from collections.abc import Iterable

MASK = "***"

# Every candidate contains one of these (in lower case): found by one plain
# scan of the lowered text, the rest is looked at only around them.
_ANCHOR = re.compile(r"://|passw|pwd|secret|scram_")
_SCHEME_CHARS = frozenset(string.ascii_letters + string.digits + "+.-")
_KEY_AT = re.compile(
    r"(?P<quote>[\"']?)"
    r"(?P<key>[\w.-]*?(?:password|passwd|secret)|pwd|scram_(?:client|server)_key)(?P=quote)"
    r"\s*(?P<sep>[=:])[ \t]*",
    re.IGNORECASE,
)
_UNQUOTED = re.compile(r"(?:\\.|[^\s\\])*\\?", re.DOTALL)
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
    match = _UNQUOTED.match(text, start)
    return start if match is None else match.end()


def _is_key_char(char: str) -> bool:
    return char.isalnum() or char in "_.-"


def _candidates(text: str) -> list[tuple[int, int, re.Match[str] | None]]:
    """``(start, end, key match or None for a URL)`` of each candidate, by start.

    A URL candidate runs from its scheme to just after ``://``; a key one
    from the key (or its opening quote) to its value.
    """
    low = text.lower()
    if len(low) != len(text):  # a few characters lengthen when lowered: ASCII only, then
        low = "".join(c.lower() if c.isascii() else "\0" for c in text)
    found: dict[int, tuple[int, re.Match[str] | None]] = {}
    for anchor in _ANCHOR.finditer(low):
        at = anchor.start()
        if anchor.group() == "://":
            start = at
            while start > 0 and text[start - 1] in _SCHEME_CHARS:
                start -= 1
            if start < at and text[start] in string.ascii_letters:
                found.setdefault(start, (at + 3, None))
            continue
        start = at
        while start > 0 and _is_key_char(text[start - 1]):
            start -= 1
        tries = [start]
        quoted = start > 0 and text[start - 1] in "'\""
        if quoted and (start == 1 or not _is_key_char(text[start - 2])):
            tries.insert(0, start - 1)  # a quoted key: 'password': ...
        for begin in tries:
            if begin in found:
                break
            match = _KEY_AT.match(text, begin)
            if match is not None:
                found[begin] = (match.end(), match)
                break
    return [(start, end, match) for start, (end, match) in sorted(found.items())]


def secret_spans(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` of every password found in ``text``, in order, not overlapping."""
    spans: list[tuple[int, int]] = []
    index = 0
    url_end = -1  # end of the URL the scan is inside (its query may hold password=)
    for start, end, match in _candidates(text):
        if start < index:
            continue
        if match is None:  # a URL
            span, url_end = url_password(text, end)
            if span is None:
                index = end
            else:
                spans.append(span)
                index = span[1]
            continue
        if match.group("sep") == ":" and not match.group("quote"):
            index = end  # "password: ..." in prose, not a parameter
            continue
        if end < len(text) and text[end] in "'\"":
            value_start, value_end = end + 1, _quoted_end(text, end + 1, text[end])
        else:
            value_start, value_end = end, _unquoted_end(text, end, start < url_end)
        if value_end > value_start:
            spans.append((value_start, value_end))
        index = max(value_end, end)
    return spans


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
