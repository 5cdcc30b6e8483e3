"""The dashboard on a WSGI host (Flask, Django): mounted under a prefix by SCRIPT_NAME,
its pages and links follow it, and an action works end to end (cookie, CSRF, Store)."""

from __future__ import annotations

import datetime as dt
import io
import re
import urllib.parse
import wsgiref.util
from collections.abc import Callable, Iterable
from typing import Any

from jobrun.job.model import NewJob, State
from jobrun.postgres.store import Store
from jobrun.web.wsgi import create_wsgi_app
from tests.web.test_app_support import csrf_of, parse

PREFIX = "/admin/jobs"


class Host:
    """A WSGI host that mounts the dashboard under PREFIX, as werkzeug's
    DispatcherMiddleware (Flask) does: SCRIPT_NAME is the prefix, PATH_INFO the rest.
    Keeps the cookies a browser would."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.cookies: dict[str, str] = {}

    def request(self, method: str, url: str, form: dict[str, str] | None = None) -> Any:
        path, _, query = url.partition("?")
        assert path.startswith(PREFIX), path
        body = urllib.parse.urlencode(form or {}).encode()
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": PREFIX,
            "PATH_INFO": path[len(PREFIX) :] or "/",
            "QUERY_STRING": query,
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
        }
        if form is not None:
            environ["CONTENT_TYPE"] = "application/x-www-form-urlencoded"
        if self.cookies:
            environ["HTTP_COOKIE"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        wsgiref.util.setup_testing_defaults(environ)
        answer: dict[str, Any] = {}

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Any:
            answer["status"] = int(status.split(maxsplit=1)[0])
            answer["headers"] = headers
            return lambda data: None

        chunks = self.app(environ, start_response)
        answer["body"] = b"".join(chunks).decode()
        for name, value in answer["headers"]:
            if name.lower() == "set-cookie":
                key, _, rest = value.partition("=")
                self.cookies[key] = rest.split(";")[0]
                answer["cookie"] = value
        return answer


def test_under_a_wsgi_prefix_pages_links_and_actions_work(store: Store) -> None:
    dead = store.enqueue(NewJob(type="t", queue="q"))
    (claim,) = store.claim("w", ["q"], 1, dt.timedelta(seconds=30))
    store.fail(claim, "boom", None, permanent=True)
    host = Host(create_wsgi_app(store))

    overview = host.request("GET", PREFIX + "/")
    assert overview["status"] == 200
    assert "Path=/admin/jobs" in overview["cookie"]
    links = re.findall(r'(?:href|src|action)="([^"]+)"', overview["body"])
    assert links and all(link.startswith(PREFIX + "/") for link in links), links
    for link in links:
        if "/static/" in link or link.endswith("/jobs") or link.endswith("/schedules"):
            assert host.request("GET", link)["status"] == 200, link

    page = host.request("GET", f"{PREFIX}/jobs/{dead.id}")
    doc = parse(page["body"])
    form = doc.by_id("job-retry")
    assert form.attrs["action"] == f"{PREFIX}/jobs/{dead.id}/retry"
    done = host.request(
        "POST", form.attrs["action"], {"csrf": csrf_of(page["body"]), "next": f"/jobs/{dead.id}"}
    )
    assert done["status"] == 303
    location = dict(done["headers"])["location"]
    assert location == f"{PREFIX}/jobs/{dead.id}?notice=retried"
    assert store.get(dead.id).state is State.QUEUED
    assert store.events(dead.id)[-1].kind.value == "retried"
    refused = host.request("POST", form.attrs["action"], {"csrf": "0" * 64, "next": "/"})
    assert refused["status"] == 403
