"""A real headless Chromium for the dashboard's tests (issue 13), and the dashboard served for it.

The browser is Debian's ``chromium`` driven by its ``chromium-driver``
through Selenium, never a browser downloaded at test time. Where they are not
installed the browser tests skip saying so, except under CI (``CI`` set),
where they fail: ``.ci/run`` installs both, so CI can never skip them
silently.

One Chromium runs per test module (:func:`chromium`); each test gets it back
clean (:func:`browser`: no cookies, a 1280x800 viewport, a blank page). The
dashboard is served by uvicorn in a thread of the test process
(:func:`serve`) or by a ``jobrun dashboard`` process
(:func:`dashboard_process`), each on a free port of 127.0.0.1.

Screenshots go to ``screenshots/`` under pytest's base temporary directory,
one file per test and page; with ``JOBRUN_UPDATE_SCREENSHOTS=1`` the ones the
docs show (the overview, a job's timeline, the schedules) are written to
``docs/screenshots/`` too (see docs/dashboard.md, "Screenshots").
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

ROOT = Path(__file__).resolve().parents[2]
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
UPDATE_SCREENSHOTS_ENV = "JOBRUN_UPDATE_SCREENSHOTS"

WIDE = (1280, 800)
NARROW = (420, 800)

_CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_CHROMEDRIVER = ("chromedriver",)
_CHROMEDRIVER_PATHS = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set, as ``.ci/run`` does): the browser must be there."""
    return _truthy(os.environ.get("CI"))


def updating_screenshots() -> bool:
    return _truthy(os.environ.get(UPDATE_SCREENSHOTS_ENV))


def find_chromium() -> tuple[str, str] | str:
    """(chromium, chromedriver) paths, or why they cannot be used."""
    binary = next((p for p in map(shutil.which, _CHROMIUM) if p), None)
    driver = next((p for p in map(shutil.which, _CHROMEDRIVER) if p), None) or next(
        (p for p in _CHROMEDRIVER_PATHS if os.access(p, os.X_OK)), None
    )
    missing = [name for name, path in (("chromium", binary), ("chromedriver", driver)) if not path]
    if missing:
        return (
            f"{' and '.join(missing)} not installed "
            "(Debian: apt-get install -y chromium chromium-driver; .ci/run installs them)"
        )
    try:
        import selenium  # noqa: F401, PLC0415
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    assert binary is not None and driver is not None
    return binary, driver


def need_chromium() -> tuple[str, str]:
    """The paths of chromium and chromedriver; skip without them, or fail under CI."""
    found = find_chromium()
    if isinstance(found, str):
        if in_ci():
            pytest.fail(f"CI must run the browser tests, but {found}", pytrace=False)
        pytest.skip(found)
    return found


def start_chromium(binary: str, driver_path: str) -> WebDriver:
    """A headless Chromium through the system chromedriver (no Selenium Manager, no download)."""
    from selenium import webdriver  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",  # we run as root
        "--disable-dev-shm-usage",
        f"--window-size={WIDE[0]},{WIDE[1]}",
        "--disable-gpu",
        "--disable-extensions",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
        "--metrics-recording-only",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--lang=en-US",
    ):
        options.add_argument(argument)
    # An alert() left open must be seen by the test, not dismissed behind its back.
    options.unhandled_prompt_behavior = "ignore"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(driver_path, log_output=subprocess.DEVNULL)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    return driver


class Browser:
    """The page as a person sees it, with the few things the tests ask of it."""

    def __init__(self, driver: WebDriver, shots: Path, test: str) -> None:
        self.driver = driver
        self.shots = shots
        self.test = test

    # -- navigation ---------------------------------------------------------

    def viewport(self, width: int, height: int) -> None:
        """Make the viewport (window.innerWidth x innerHeight) exactly this size."""
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def open(self, url: str) -> None:
        self.driver.get(url)
        self.wait_loaded()

    def wait_loaded(self) -> None:
        self.wait_until(
            lambda: self.driver.execute_script("return document.readyState") == "complete",
            "the page to load",
        )

    def reload(self) -> None:
        self.driver.refresh()
        self.wait_loaded()

    @property
    def url(self) -> str:
        return str(self.driver.current_url)

    @property
    def path(self) -> str:
        """The current URL without its scheme and host."""
        return re.sub(r"^[a-z]+://[^/]+", "", self.url)

    # -- reading ----------------------------------------------------------
    #
    # Live regions replace their content every second or so: an element found
    # in one WebDriver call may be gone by the next. So every read below is
    # one script, run in one turn of the page's event loop (no refresh can
    # land in the middle of it).

    def find(self, css: str) -> WebElement:
        from selenium.webdriver.common.by import By  # noqa: PLC0415

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def count(self, css: str) -> int:
        return int(self.js("return document.querySelectorAll(arguments[0]).length", css))

    def has(self, css: str) -> bool:
        return self.count(css) > 0

    def text(self, css: str = "body") -> str:
        """The visible text of the first element matching css ('' when there is none)."""
        return str(
            self.js(
                "const e = document.querySelector(arguments[0]);"
                " return e ? e.innerText.trim() : ''",
                css,
            )
        )

    def texts(self, css: str) -> list[str]:
        return list(
            self.js(
                "return Array.from(document.querySelectorAll(arguments[0]),"
                " e => e.innerText.trim())",
                css,
            )
        )

    def attr(self, css: str, name: str) -> str | None:
        """An attribute of the first element matching css (None without one, or no element)."""
        value = self.js(
            "const e = document.querySelector(arguments[0]);"
            " return e ? e.getAttribute(arguments[1]) : null",
            css,
            name,
        )
        return None if value is None else str(value)

    def rows(self, css: str, *names: str) -> list[dict[str, str | None]]:
        """For each element matching css, its attributes ``names`` (data-x given as x)."""
        return [
            dict(zip(names, values, strict=True))
            for values in self.js(
                "return Array.from(document.querySelectorAll(arguments[0]),"
                " e => arguments[1].map(n => e.getAttribute(n)))",
                css,
                [
                    n if n.startswith(("data-", "href", "value", "id", "class")) else f"data-{n}"
                    for n in names
                ],
            )
        ]

    def value(self, css: str) -> str | None:
        """The current value of a form field."""
        got = self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.value : null", css
        )
        return None if got is None else str(got)

    def page(self) -> str | None:
        return self.attr("body", "data-page")

    def same_document(self, marker: str) -> bool:
        """Whether the page still carries the marker set by :meth:`mark` (no reload since)."""
        return bool(self.js("return window.__jobrunTestMark === arguments[0]", marker))

    def mark(self) -> str:
        """Tag this document; a reload or navigation loses the tag."""
        marker = f"m{time.monotonic_ns()}"
        self.js("window.__jobrunTestMark = arguments[0]", marker)
        return marker

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait_until(
        self, condition: Callable[[], Any], what: str, timeout: float = 20.0, interval: float = 0.1
    ) -> Any:
        """Poll condition until it is truthy; fail naming what was awaited and the page."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                shot = self.screenshot(f"timeout-{re.sub(r'[^a-z0-9]+', '-', what.lower())}")
                raise AssertionError(
                    f"waited {timeout} s for {what} at {self.url}; screenshot {shot}\n"
                    f"--- page text ---\n{self.text()[:3000]}"
                )
            time.sleep(interval)

    def wait_text(self, css: str, needle: str, timeout: float = 20.0) -> str:
        """Wait until the element at css shows needle (as live refresh would bring it)."""
        return str(
            self.wait_until(
                lambda: (t := self.text(css)) and needle in t and t,
                f"{needle!r} in {css}",
                timeout,
            )
        )

    # -- acting -------------------------------------------------------------

    def click(self, css: str) -> None:
        """Click the element at css (found again if a live refresh replaced it meanwhile)."""
        from selenium.common.exceptions import StaleElementReferenceException  # noqa: PLC0415

        for attempt in range(5):
            try:
                element = self.find(css)
                self.js("arguments[0].scrollIntoView({block: 'center'})", element)
                element.click()
                return
            except StaleElementReferenceException:
                if attempt == 4:
                    raise
                time.sleep(0.05)

    def select(self, css: str, value: str) -> None:
        """Choose the option of value ``value`` in the <select> at css."""
        from selenium.webdriver.support.select import Select  # noqa: PLC0415

        Select(self.find(css)).select_by_value(value)

    def click_through(self, css: str) -> None:
        """Click the link or button at css and wait for the page it leads to."""
        marker = self.mark()
        self.click(css)
        self.wait_until(
            lambda: not self._still(marker), f"the page after clicking {css}", timeout=30
        )
        self.wait_loaded()

    def _still(self, marker: str) -> bool:
        from selenium.common.exceptions import WebDriverException  # noqa: PLC0415

        try:
            return self.same_document(marker)
        except WebDriverException:  # between two documents
            return True

    # -- what must not happen ----------------------------------------------

    def pwned(self) -> Any:
        """What an injected script would have set (None when nothing ran)."""
        return self.js("return window.__pwned")

    def alert(self) -> str | None:
        """The text of an open alert/confirm/prompt, or None."""
        from selenium.common.exceptions import NoAlertPresentException  # noqa: PLC0415

        try:
            return str(self.driver.switch_to.alert.text)
        except NoAlertPresentException:
            return None

    def console_errors(self) -> list[str]:
        """The SEVERE console messages since the last call (scripts failing, say)."""
        return [
            str(entry["message"])
            for entry in self.driver.get_log("browser")
            if entry.get("level") == "SEVERE" and "favicon.ico" not in str(entry["message"])
        ]

    def horizontal_overflow(self) -> tuple[int, int]:
        """(document.body.scrollWidth, window.innerWidth), and the wider of the root's."""
        return tuple(  # type: ignore[return-value]
            self.js(
                "return [Math.max(document.body.scrollWidth,"
                " document.documentElement.scrollWidth), window.innerWidth]"
            )
        )

    def sticking_out(self, limit: int = 5) -> list[str]:
        """What makes the page wider than the viewport: the innermost elements that reach
        past its right edge, or whose own content (a long word, say) spills out of them
        while no ancestor scrolls or clips it; as ``tag#id.class (px)``."""
        return list(
            self.js(
                """
                const width = window.innerWidth;
                const spills = e => {
                  const r = e.getBoundingClientRect();
                  if (r.width === 0 && r.height === 0) return false;
                  if (r.right > width + 0.5) return true;
                  const ox = getComputedStyle(e).overflowX;
                  return ox === 'visible' && e.scrollWidth > e.clientWidth + 1
                    && r.left + e.scrollWidth > width + 0.5;
                };
                const contained = e => {
                  for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
                    if (['auto', 'scroll', 'hidden', 'clip'].includes(
                        getComputedStyle(p).overflowX)) return true;
                  }
                  return false;
                };
                const out = [];
                for (const e of document.body.querySelectorAll('*')) {
                  if (!spills(e) || contained(e)) continue;
                  if (Array.from(e.children).some(c => spills(c))) continue;
                  const cls = typeof e.className === 'string' && e.className.trim()
                    ? '.' + e.className.trim().split(/\\s+/).join('.') : '';
                  out.push(e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + cls
                    + ' (' + Math.round(e.getBoundingClientRect().left + e.scrollWidth) + 'px)');
                  if (out.length >= arguments[0]) break;
                }
                return out;
                """,
                limit,
            )
        )

    # -- screenshots --------------------------------------------------------

    def screenshot(self, page: str) -> Path:
        """This viewport as a PNG under the session's screenshots folder."""
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{self.test}--{page}.png"
        self.driver.save_screenshot(str(path))
        return path

    def screenshot_of(self, css: str, page: str) -> Path:
        """Only the element at css as a PNG (smaller than the viewport, for the docs)."""
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{self.test}--{page}.png"
        self.find(css).screenshot(str(path))
        return path


# -- fixtures (imported by the test modules) ---------------------------------


@pytest.fixture(scope="module")
def chromium() -> Iterator[WebDriver]:
    """One headless Chromium for the whole module."""
    binary, driver_path = need_chromium()
    driver = start_chromium(binary, driver_path)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def screenshots_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the browser tests' screenshots go: screenshots/ under pytest's base temp."""
    path = tmp_path_factory.getbasetemp() / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser(
    chromium: WebDriver, screenshots_dir: Path, request: pytest.FixtureRequest
) -> Iterator[Browser]:
    """The module's Chromium, clean for this test: no cookies, 1280x800, a blank page."""
    chromium.get("about:blank")
    chromium.delete_all_cookies()
    chromium.get_log("browser")  # forget earlier tests' console
    test = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:80]
    page = Browser(chromium, screenshots_dir, test)
    page.viewport(*WIDE)
    yield page
    if page.alert() is not None:
        chromium.switch_to.alert.dismiss()


# -- the dashboard, served ---------------------------------------------------


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a thread on a free port; yields its base URL."""
    import uvicorn  # noqa: PLC0415

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        access_log=False,
        ws="none",
        lifespan="auto",
    )
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if failure or not thread.is_alive():
            raise AssertionError(f"the dashboard did not start: {failure}")
        if time.monotonic() > deadline:
            raise AssertionError("the dashboard did not start within 30 s")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive(), "the dashboard's server thread did not stop"


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(errors="replace")


class DashboardProcess:
    """A ``jobrun dashboard`` process and where it serves."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, base: str) -> None:
        self.proc = proc
        self.log = log
        self.base = base

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)


SERVING = re.compile(r"dashboard on (?P<url>http://[^/\s]+)/")


@contextlib.contextmanager
def dashboard_process(
    dsn: str, log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[DashboardProcess]:
    """``jobrun dashboard --bind 127.0.0.1:0 ARGS`` on DATABASE_URL=dsn, once it answers.

    Port 0 takes a free port; the process's line ``jobrun: dashboard on URL``
    says which, as it tells a person starting it by hand.
    """
    environ = {**os.environ, "DATABASE_URL": dsn, "PYTHONPATH": str(ROOT), **(env or {})}
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobrun.cli", "dashboard", "--bind", "127.0.0.1:0", *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=ROOT,
        )
    made = DashboardProcess(proc, log, "")
    try:
        deadline = time.monotonic() + 60
        while not (found := SERVING.search(made.output())):
            if proc.poll() is not None:
                raise AssertionError(f"jobrun dashboard exited {proc.returncode}:\n{made.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"jobrun dashboard said nothing in 60 s:\n{made.output()}")
            time.sleep(0.05)
        made.base = found["url"]
        yield made
    finally:
        made.stop()


def save_for_docs(shot: Path, name: str) -> Path | None:
    """Copy a screenshot to docs/screenshots/NAME when JOBRUN_UPDATE_SCREENSHOTS is set."""
    if not updating_screenshots():
        return None
    DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    target = DOCS_SCREENSHOTS / name
    shutil.copyfile(shot, target)
    return target
