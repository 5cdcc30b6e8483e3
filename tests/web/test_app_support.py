"""Helpers for the dashboard's HTTP tests (tests/web/test_app*.py): no tests here.

The dashboard is driven through Starlette's TestClient (httpx) against the
test's real database; a page is parsed with the standard library's HTML
parser, so that a test reads elements and attributes the way a browser
would, not substrings of markup.
"""

from __future__ import annotations

import html.parser
import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from jobrun.postgres.store import Store
from jobrun.web import create_app


class Element:
    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag = tag
        self.attrs = attrs
        self.text_parts: list[str] = []
        self.children: list[Element] = []

    @property
    def id(self) -> str | None:
        return self.attrs.get("id")

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    @property
    def text(self) -> str:
        return " ".join("".join([*self.text_parts, *(c.text for c in self.children)]).split())

    def walk(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            yield from child.walk()

    def select(
        self, tag: str | None = None, *, cls: str | None = None, **attrs: str
    ) -> list[Element]:
        """Descendants (self included) by tag, class and exact attributes (data_x: data-x)."""
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            e
            for e in self.walk()
            if (tag is None or e.tag == tag)
            and (cls is None or cls in e.classes)
            and all(e.attrs.get(k) == v for k, v in wanted.items())
        ]

    def one(self, tag: str | None = None, *, cls: str | None = None, **attrs: str) -> Element:
        found = self.select(tag, cls=cls, **attrs)
        assert len(found) == 1, (tag, cls, attrs, len(found))
        return found[0]

    def by_id(self, element_id: str) -> Element:
        return self.one(id=element_id)

    def has_id(self, element_id: str) -> bool:
        return bool(self.select(id=element_id))


_VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
    "line",
    "rect",
    "path",
    "circle",
}


class _Parser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in _VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].text_parts.append(data)


def parse(text: str) -> Element:
    parser = _Parser()
    parser.feed(text)
    parser.close()
    return parser.root


_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


def csrf_of(text: str) -> str:
    match = _CSRF.search(text)
    assert match, "no CSRF token in the page"
    return match.group(1)


def post(client: TestClient, page: str, path: str, **fields: str) -> Any:
    """GET ``page`` (for the CSRF cookie and token), then POST ``fields`` to ``path``."""
    got = client.get(page)
    assert got.status_code == 200, got.text
    data = {"csrf": csrf_of(got.text), "next": fields.pop("next", page), **fields}
    return client.post(path, data=data, follow_redirects=False)


@pytest.fixture
def app(store: Store) -> Any:
    return create_app(store)


@pytest.fixture
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c
