"""One small HTTP server for the probes and the scraper: ``/healthz``, ``/readyz``, ``/metrics``.

::

    server = ObserveServer(health, registry=metrics.registry, host="0.0.0.0", port=9464)
    server.start()          # binds now (port 0: any free port, see server.port)
    ...
    server.stop()

``GET /healthz`` and ``GET /readyz`` answer ``200 ok`` or ``503`` with one
line of plain text naming what failed (:class:`jobrun.observe.health.Verdict`);
``GET /metrics`` answers the Prometheus exposition of ``registry`` when one
is given (prometheus-client, imported only then); anything else is 404.

It is the standard library's ``ThreadingHTTPServer`` on a daemon thread: a
slow probe never holds up another, and the server never keeps the process
alive. Request lines are logged at DEBUG only (logger
``jobrun.observe.http``): a probe every few seconds must not fill the
worker's log.
"""

from __future__ import annotations

import logging
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from jobrun.config import DEFAULT_OBSERVE_HOST
from jobrun.job.errors import ValidationError
from jobrun.observe.health import Health, Verdict

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["ObserveServer"]

log = logging.getLogger("jobrun.observe.http")

REQUEST_TIMEOUT = 10.0
"""Seconds a client may take to send its request before its connection is closed."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Bound by ObserveServer; read by the handler.
    health: Health | None
    registry: CollectorRegistry | None


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "jobrun"
    timeout = REQUEST_TIMEOUT

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        health = self.server.health
        if path == "/healthz" and health is not None:
            self._verdict(health.liveness())
        elif path == "/readyz" and health is not None:
            self._verdict(health.readiness())
        elif path == "/metrics" and self.server.registry is not None:
            self._metrics(self.server.registry)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")

    def _verdict(self, verdict: Verdict) -> None:
        status = HTTPStatus.OK if verdict.ok else HTTPStatus.SERVICE_UNAVAILABLE
        self._send(status, f"{verdict}\n".encode(), "text/plain; charset=utf-8")

    def _metrics(self, registry: CollectorRegistry) -> None:
        from prometheus_client.exposition import choose_encoder  # noqa: PLC0415 - optional

        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        try:
            body = encoder(registry)
        except Exception as exc:  # noqa: BLE001 - a failing collector is an answer, not a crash
            log.warning("collecting metrics failed: %s: %s", type(exc).__name__, exc)
            self._send(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                f"collecting metrics failed: {type(exc).__name__}\n".encode(),
                "text/plain; charset=utf-8",
            )
            return
        self._send(HTTPStatus.OK, body, content_type)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class ObserveServer:
    """``/healthz`` and ``/readyz`` from ``health``, ``/metrics`` from ``registry`` (see above).

    Either may be None (that path is then 404). ``port`` 0 takes any free
    port: :attr:`port` says which, once started. ``host`` is an address or
    a name to listen on (an IPv6 address listens on IPv6); by default every
    IPv4 interface, as ``JOBRUN_OBSERVE_HOST`` (:mod:`jobrun.config`) says why.
    """

    def __init__(
        self,
        health: Health | None = None,
        registry: CollectorRegistry | None = None,
        *,
        host: str = DEFAULT_OBSERVE_HOST,
        port: int = 0,
    ) -> None:
        self.health = health
        self.registry = registry
        self.host = host.strip("[]")
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The port it listens on (the one asked for, until started)."""
        if self._server is not None:
            return int(self._server.server_address[1])
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port`` of the server (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def paths(self) -> list[str]:
        """The paths it answers."""
        paths = ["/healthz", "/readyz"] if self.health is not None else []
        return [*paths, "/metrics"] if self.registry is not None else paths

    def start(self) -> None:
        """Bind and serve on a daemon thread. Safe to call twice.

        A port that cannot be bound (in use, not allowed) raises a
        ValidationError naming the address.
        """
        with self._lock:
            if self._server is not None:
                return
            cls = _Server6 if ":" in self.host else _Server
            try:
                server = cls((self.host, self._port), _Handler)
            except OSError as exc:
                raise ValidationError(
                    "port", f"cannot listen on {self.host}:{self._port}: {exc.strerror or exc}"
                ) from None
            server.health = self.health
            server.registry = self.registry
            self._server = server
            self._thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name="jobrun-observe-http",
                daemon=True,
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket. Safe to call twice and before start()."""
        with self._lock:
            server, thread = self._server, self._thread
            self._thread = None
            if server is None or thread is None:
                return
        server.shutdown()
        server.server_close()
        thread.join(5.0)
