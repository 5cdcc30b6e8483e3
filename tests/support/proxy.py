"""A TCP proxy between jobrun and PostgreSQL that can misbehave on purpose.

Every connection through :class:`TcpProxy` is forwarded byte for byte, while
the proxy follows the wire protocol closely enough to know each connection's
``application_name`` (from the startup message) and which statement each
reply answers. A test can then, for every connection open now or only for one
role (``jobrun-worker``, ``jobrun-listener``, ``jobrun-leader``,
``jobrun-reaper``, ...):

``blackhole(role)``
    Stop forwarding in both directions without closing anything (half-open):
    the client waits for answers that never come and the server keeps the
    session (and its locks). New connections still pass. ``cut()`` later
    closes the server side, as the server would once its own TCP keepalive
    gave up.
``hold_new()``
    Accept new connections but never forward them: a connect hangs until the
    client's connect timeout.
``reset(role)``
    Reset the connections (RST to the client, close to the server).
``drop_reply(match)``
    Forward the next statement whose text contains ``match`` (``"COMMIT"``,
    or the text of an autocommit statement), let the server execute it, then
    swallow its reply and reset the client connection: the change is
    committed but the client only sees a lost connection.

The blackhole is a user-space one: the proxy's kernel still acknowledges
packets and answers TCP keepalives, so it exercises client-side deadlines
(probes, pool timeouts, watchdogs), not the kernel's keepalive detection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import psycopg.conninfo

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102


@dataclasses.dataclass(eq=False)
class Connection:
    """One client connection through the proxy and its upstream twin."""

    client: socket.socket
    upstream: socket.socket
    role: str | None = None
    """The ``application_name`` the client sent at startup (None until then)."""
    started: threading.Event = dataclasses.field(default_factory=threading.Event)
    blackholed: bool = False
    closed: bool = False
    statements: dict[str, str] = dataclasses.field(default_factory=dict)
    transaction: list[str] = dataclasses.field(default_factory=list)
    """The statements sent since the last COMMIT or ROLLBACK."""
    dropping: DropReply | None = None


@dataclasses.dataclass(eq=False)
class DropReply:
    """An armed ``drop_reply``: ``fired`` is set once a reply was swallowed."""

    match: Callable[[str], bool]
    role: str | None
    remaining: int
    after: str | None = None
    fired: threading.Event = dataclasses.field(default_factory=threading.Event)
    statements: list[str] = dataclasses.field(default_factory=list)
    """The statements whose reply was dropped."""


def _cstring(data: bytes, start: int) -> tuple[str, int]:
    end = data.index(b"\x00", start)
    return data[start:end].decode("utf-8", "replace"), end + 1


class TcpProxy:
    """See the module docstring. ``conninfo`` points at the proxy (same db, user, password)."""

    def __init__(self, conninfo: str, *, listen_host: str = "127.0.0.1") -> None:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
        self._upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self._listener = socket.create_server((listen_host, 0))
        self._listener.settimeout(0.1)
        # Plain-text protocol, so the proxy can read it.
        params.update(
            host=listen_host,
            port=self._listener.getsockname()[1],
            sslmode="disable",
            gssencmode="disable",
        )
        self.conninfo = psycopg.conninfo.make_conninfo("", **params)
        self._lock = threading.Lock()
        self._conns: list[Connection] = []
        self._all: list[Connection] = []
        self._drops: list[DropReply] = []
        self._holding = False
        self._held: list[socket.socket] = []
        self._closed = False
        self._accepter = threading.Thread(target=self._accept, name="test-proxy", daemon=True)
        self._accepter.start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def url(self) -> str:
        """The proxy as a ``key=value`` connection string (same as :attr:`conninfo`)."""
        return self.conninfo

    # -- accepting and pumping ------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._holding:
                with self._lock:
                    self._held.append(client)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _rst(client)
                continue
            conn = Connection(client=client, upstream=upstream)
            with self._lock:
                self._conns.append(conn)
                self._all.append(conn)
            threading.Thread(
                target=self._client_to_server, args=(conn,), name="test-proxy-c2s", daemon=True
            ).start()
            threading.Thread(
                target=self._server_to_client, args=(conn,), name="test-proxy-s2c", daemon=True
            ).start()

    def _client_to_server(self, conn: Connection) -> None:
        buf = b""
        startup = True
        while True:
            try:
                data = conn.client.recv(65536)
            except OSError:
                data = b""
            if conn.blackholed:
                if not data:
                    return  # the client gave up; the server side stays open until cut()
                continue  # swallowed
            if not data:
                self._close(conn)
                return
            buf += data
            # Forward whole messages only, looking at each on the way.
            while True:
                if startup:
                    if len(buf) < 8:
                        break
                    (length,) = struct.unpack("!I", buf[:4])
                    if len(buf) < length:
                        break
                    message, buf = buf[:length], buf[length:]
                    (code,) = struct.unpack("!I", message[4:8])
                    if code not in (_SSL_REQUEST, _GSSENC_REQUEST, _CANCEL_REQUEST):
                        conn.role = _startup_application_name(message)
                        conn.started.set()
                        startup = False
                    if not self._send(conn, conn.upstream, message):
                        return
                    continue
                if len(buf) < 5:
                    break
                (length,) = struct.unpack("!I", buf[1:5])
                if len(buf) < length + 1:
                    break
                message, buf = buf[: length + 1], buf[length + 1 :]
                self._inspect(conn, message)
                if conn.blackholed:
                    break
                if not self._send(conn, conn.upstream, message):
                    return

    def _inspect(self, conn: Connection, message: bytes) -> None:
        kind, body = message[:1], message[5:]
        text: str | None = None
        try:
            if kind == b"Q":
                text, _ = _cstring(body, 0)
            elif kind == b"P":
                name, pos = _cstring(body, 0)
                query, _ = _cstring(body, pos)
                conn.statements[name] = query
            elif kind == b"B":
                _portal, pos = _cstring(body, 0)
                name, _ = _cstring(body, pos)
                text = conn.statements.get(name)
        except ValueError:
            return
        if text is None or conn.dropping is not None:
            return
        history = conn.transaction
        if _is_end_of_transaction(text):
            conn.transaction = []
        else:
            history.append(text)
        with self._lock:
            for drop in self._drops:
                wanted = drop.remaining > 0 and (drop.role is None or drop.role == conn.role)
                if wanted and drop.after is not None:
                    wanted = any(drop.after in s.upper() for s in history)
                if wanted and drop.match(text):
                    drop.remaining -= 1
                    drop.statements.append(text)
                    conn.dropping = drop  # armed before the statement reaches the server
                    return

    def _server_to_client(self, conn: Connection) -> None:
        buf = b""
        while True:
            try:
                data = conn.upstream.recv(65536)
            except OSError:
                data = b""
            if conn.blackholed:
                if not data:
                    return
                continue
            if not data:
                self._close(conn)
                return
            drop = conn.dropping
            if drop is None:
                if not self._send(conn, conn.client, data):
                    return
                continue
            # Swallow everything up to the ReadyForQuery that ends the statement's
            # reply: by then the server has committed it.
            buf += data
            if _has_ready_for_query(buf):
                drop.fired.set()
                _rst(conn.client)
                self._close(conn)
                return

    def _send(self, conn: Connection, sock: socket.socket, data: bytes) -> bool:
        try:
            sock.sendall(data)
        except OSError:
            self._close(conn)
            return False
        return True

    def _close(self, conn: Connection) -> None:
        conn.closed = True
        for sock in (conn.client, conn.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        with self._lock, contextlib.suppress(ValueError):
            self._conns.remove(conn)

    # -- faults -------------------------------------------------------------------------

    def connections(self, role: str | None = None) -> list[Connection]:
        """Open, forwarding connections (of ``role``, when given)."""
        with self._lock:
            conns = list(self._conns)
        return [c for c in conns if not c.blackholed and (role is None or c.role == role)]

    def blackhole(self, role: str | None = None) -> int:
        """Make the open connections (of ``role``) half-open; returns how many."""
        conns = self.connections(role)
        for conn in conns:
            conn.blackholed = True
        return len(conns)

    def cut(self) -> None:
        """Close the blackholed connections (the server notices; the client does not)."""
        with self._lock:
            holes = [c for c in self._conns if c.blackholed]
        for conn in holes:
            with contextlib.suppress(OSError):
                conn.upstream.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.upstream.close()
            with self._lock, contextlib.suppress(ValueError):
                self._conns.remove(conn)
        with self._lock:
            held, self._held = self._held, []
        for sock in held:
            _rst(sock)

    def reset(self, role: str | None = None) -> int:
        """Reset the open connections (of ``role``); returns how many."""
        conns = self.connections(role)
        for conn in conns:
            _rst(conn.client)
            self._close(conn)
        return len(conns)

    def reset_blackholed(self) -> int:
        """Reset the blackholed connections (RST to the client, close to the
        server): their clients see the end at once; returns how many."""
        with self._lock:
            holes = [c for c in self._conns if c.blackholed]
        for conn in holes:
            _rst(conn.client)
            self._close(conn)
        return len(holes)

    def hold_new(self, on: bool = True) -> None:
        """While on, new connections are accepted and never answered."""
        self._holding = on

    def held(self) -> int:
        """How many connections ``hold_new`` accepted and holds unanswered now."""
        with self._lock:
            return len(self._held)

    def drop_reply(
        self,
        match: str | Callable[[str], bool],
        *,
        role: str | None = None,
        count: int = 1,
        after: str | None = None,
    ) -> DropReply:
        """Drop the reply to the next ``count`` statements matching ``match`` (see the module doc).

        A str matches statements containing it (case-insensitive); ``"COMMIT"``
        matches only a COMMIT command. With ``after``, only in a transaction
        that already ran a statement containing ``after`` (e.g. the COMMIT of
        a Complete: ``after="INSERT INTO jobrun.processed_effects"``).
        """
        if isinstance(match, str):
            needle = match.strip().upper()
            if needle == "COMMIT":

                def matcher(text: str) -> bool:
                    return text.strip().rstrip(";").strip().upper() == "COMMIT"

            else:

                def matcher(text: str) -> bool:
                    return needle in text.upper()

        else:
            matcher = match
        drop = DropReply(
            match=matcher, role=role, remaining=count, after=after.upper() if after else None
        )
        with self._lock:
            self._drops.append(drop)
        return drop

    def disarm(self) -> None:
        with self._lock:
            for drop in self._drops:
                drop.remaining = 0
            self._drops.clear()

    def close(self) -> None:
        """Stop accepting and close every connection, half-open ones included."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.hold_new(False)
        self.cut()
        with self._lock:
            everything, self._all = self._all, []
        for conn in everything:
            self._close(conn)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _rst(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed middlebox would.

    SHUT_RD first wakes a pump thread blocked in recv() on this socket: the
    kernel releases the socket (and sends the RST) only once that call returns.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


def _is_end_of_transaction(text: str) -> bool:
    return text.strip().rstrip(";").strip().upper() in ("COMMIT", "ROLLBACK")


def _startup_application_name(message: bytes) -> str | None:
    parts = message[8:].split(b"\x00")
    for name, value in zip(parts[::2], parts[1::2], strict=False):
        if name == b"application_name":
            return value.decode("utf-8", "replace")
    return None


def _has_ready_for_query(buf: bytes) -> bool:
    pos = 0
    while pos + 5 <= len(buf):
        kind = buf[pos : pos + 1]
        (length,) = struct.unpack("!I", buf[pos + 1 : pos + 5])
        if pos + 1 + length > len(buf):
            return False
        if kind == b"Z":
            return True
        pos += 1 + length
    return False


__all__ = ["Connection", "DropReply", "TcpProxy"]
