"""``jobrun dashboard``: the dashboard served by uvicorn, safe by default.

It listens on 127.0.0.1:8080 unless told ``--bind HOST:PORT`` (port 0: any
free port; ``[::1]:8080`` for IPv6). A loopback address is reachable from
this machine only; any other address is reachable by whoever can route to
it, so binding one needs a credential: ``JOBRUN_DASHBOARD_TOKEN`` (at least
16 characters), which every request must then carry as a bearer token or as
the basic-auth password (any user name; a browser asks for it). Without one
the command refuses to start, saying so (exit code 7, like any bad
configuration). A token given is required on loopback too. Without a token
only requests naming a loopback host (or the address bound) in their Host
header are served, which keeps DNS-rebinding pages out.

Once listening it writes one line on stderr, ``jobrun: dashboard on
http://HOST:PORT/ (database user@host:port/db[, read-only])``, and serves
until SIGINT or SIGTERM.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
from types import FrameType
from typing import Any

from jobrun.job.errors import ValidationError
from jobrun.web.security import MIN_TOKEN_CHARS

DEFAULT_BIND = "127.0.0.1:8080"
TOKEN_ENV = "JOBRUN_DASHBOARD_TOKEN"  # noqa: S105 - the variable's name, not a secret


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) as a host and a port; ValidationError naming --bind."""
    value = text.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValidationError("--bind", f"{text!r} is not HOST:PORT (like 127.0.0.1:8080)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValidationError("--bind", f"{text!r}: write an IPv6 address in brackets, [::1]:8080")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValidationError("--bind", f"{text!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None) -> None:
    """Refuse (ValidationError) a non-loopback address without a token, or a short token."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ValidationError(
            TOKEN_ENV, f"must be at least {MIN_TOKEN_CHARS} characters (a long random string)"
        )
    if token is None and not is_loopback(host):
        raise ValidationError(
            "--bind",
            f"refusing to serve the dashboard on {host} without a credential: anyone who "
            f"can reach that address could cancel and retry jobs. Set {TOKEN_ENV} (a long "
            "random string, sent as a bearer token or basic-auth password), or bind "
            "127.0.0.1",
        )


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def allowed_hosts(host: str, token: str | None) -> list[str] | None:
    """The Host headers to accept: any with a token; without one the loopback names and
    the address bound (a rebinding page names another host, see jobrun.web.security)."""
    if token is not None:
        return None
    return sorted({*LOOPBACK_NAMES, host.lower()})


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); ValidationError when the address is taken."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValidationError("--bind", f"cannot resolve {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ValidationError(
            "--bind", f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def serve(app: Any, sock: socket.socket, *, describe: str, log_level: str = "warning") -> None:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM, after the one line on stderr."""
    import uvicorn  # noqa: PLC0415 - the extra's server, only when serving

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # SIGINT or SIGTERM ends the dashboard cleanly (exit code 0): the
            # signal is not raised again once the server has stopped, as
            # uvicorn does by default. A second SIGINT forces the exit.
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            else:
                self.should_exit = True

    config = uvicorn.Config(
        app, log_level=log_level, access_log=log_level == "debug", lifespan="on"
    )
    server = Server(config)
    sys.stderr.write(f"jobrun: dashboard on {url_of(sock)} ({describe})\n")
    sys.stderr.flush()
    server.run(sockets=[sock])
