"""Network namespaces joined to this one by veth pairs: "hosts" with addresses of their own.

The fault suite's cable test pulls one (:meth:`NetNamespace.down`); the
scale test (tests/scale) runs worker processes on several, each reaching
PostgreSQL and PgBouncer from its own address. A process runs inside one
with ``ip netns exec NAME ...``. Needs
CAP_NET_ADMIN (root).
"""

from __future__ import annotations

import contextlib
import os
import subprocess


class NetNamespace:
    """A network namespace joined to this one by a veth pair: a cable a test can pull.

    A process started in it (``Workers.start(netns=ns.name)``) reaches this
    namespace at :attr:`host` only, through the veth pair. :meth:`down`
    silently drops every packet both ways, as a dead network does (no RST, no
    FIN, no ACK, no keepalive answer): the kernel-level half-open that a
    user-space proxy cannot fake. Needs CAP_NET_ADMIN (root).
    """

    _count = 0

    def __init__(self) -> None:
        NetNamespace._count += 1
        n = (os.getpid() % 200) * 50 + NetNamespace._count % 50
        self.name = f"jrf{os.getpid()}-{NetNamespace._count}"
        self.outer = f"jrf{n}a"
        self.inner = f"jrf{n}b"
        third, fourth = divmod(n * 4, 256)
        self.host = f"10.231.{third}.{fourth + 1}"
        self.peer = f"10.231.{third}.{fourth + 2}"
        self._run("ip", "netns", "add", self.name)
        try:
            self._run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
            self._run("ip", "link", "set", self.inner, "netns", self.name)
            self._run("ip", "addr", "add", f"{self.host}/30", "dev", self.outer)
            self._run("ip", "link", "set", self.outer, "up")
            inside = ["ip", "netns", "exec", self.name]
            self._run(*inside, "ip", "addr", "add", f"{self.peer}/30", "dev", self.inner)
            self._run(*inside, "ip", "link", "set", self.inner, "up")
            self._run(*inside, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _run(*args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, timeout=30)

    @staticmethod
    def available() -> str | None:
        """None when namespaces can be made here, else why not."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        try:
            probe = NetNamespace()
        except (OSError, subprocess.CalledProcessError) as exc:
            return f"cannot create a network namespace: {exc}"
        probe.close()
        return None

    def down(self) -> None:
        """Pull the cable: packets are dropped silently, both ways."""
        self._run("ip", "link", "set", self.outer, "down")

    def up(self) -> None:
        self._run("ip", "link", "set", self.outer, "up")

    def close(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(
                ["ip", "link", "del", self.outer], check=False, capture_output=True, timeout=30
            )
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(
                ["ip", "netns", "del", self.name], check=False, capture_output=True, timeout=30
            )
