"""Fixtures of the scale test: worker hosts, one PostgreSQL they all reach, a PgBouncer.

The hosts are network namespaces (:class:`tests.support.netns.NetNamespace`,
the fault suite's cable-test mechanism), each behind its own veth pair with
its own address. The session's PostgreSQL is always the harness's local
cluster (:func:`tests.support.database.local_server`; never
``JOBRUN_TEST_DATABASE_URL`` or a container: its CPU is read from /proc,
and it must listen where the hosts are), started to listen on loopback
and on the hosts' side of every pair too, and with production durability
(``fsync``, ``synchronous_commit`` and ``full_page_writes`` on, unlike the
rest of the suite): what is measured is what a deployment would see. One
PgBouncer in transaction mode listens on the same addresses.

The suite runs with ``make test-scale`` (``pytest tests/scale``); plain
``make test`` leaves it out (see ``pytest_ignore_collect`` in tests/conftest.py).
Without root (no namespaces) it skips, except with ``CI=true``, where it fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.database import TestServer, local_server
from tests.support.netns import NetNamespace
from tests.support.pgbouncer import PgBouncer, ci, pgbouncer_binary

HOSTS = [int(n) for n in os.environ.get("JOBRUN_SCALE_HOSTS", "1,2,4").split(",") if n.strip()]
"""How many hosts each drain uses, in order (``JOBRUN_SCALE_HOSTS``)."""

SERVER_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "128MB",
    "max_locks_per_transaction": "256",
}
"""The server's defaults otherwise (durable), as ``make bench`` runs it."""


def _unavailable(reason: str) -> None:
    if ci():
        pytest.fail(f"{reason}; CI=true: the scale test must run", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def hosts() -> Iterator[list[NetNamespace]]:
    """As many worker hosts as the largest drain uses, each with its own address."""
    reason = NetNamespace.available()
    if reason is not None:
        _unavailable(reason)
    made: list[NetNamespace] = []
    try:
        for _ in range(max(HOSTS)):
            made.append(NetNamespace())
        yield made
    finally:
        for ns in made:
            ns.close()


@pytest.fixture(scope="session")
def pg_server(hosts: list[NetNamespace]) -> Iterator[TestServer]:
    """The one PostgreSQL of the test, reachable from every host (overrides the root one)."""
    listen = ",".join(["127.0.0.1", *(h.host for h in hosts)])
    hba = tuple(f"host all all {h.peer}/32 trust" for h in hosts)
    with local_server({**SERVER_SETTINGS, "listen_addresses": listen}, hba) as server:
        server.create_template()
        yield server


@pytest.fixture(scope="session")
def bouncer(pg_server: TestServer, hosts: list[NetNamespace]) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode, on loopback and on every host's address."""
    if pgbouncer_binary() is None:
        _unavailable("pgbouncer is not installed (apt-get install pgbouncer)")
    b = PgBouncer(
        pg_server.admin_dsn,
        pool_mode="transaction",
        users={"postgres": ""},
        listen_addr=",".join(["127.0.0.1", *(h.host for h in hosts)]),
    )
    b.start()
    try:
        yield b
    finally:
        b.destroy()
