"""Fork safety: after a fork, a pool made in the parent never serves the child.

The oracle: every process asks ``SELECT <its own marker>, pg_backend_pid()``
thousands of times from several threads while the other process does the
same, and checks the echo; the server sessions each process saw must be
disjoint; jobs enqueued through the Store come back with the asker's id and
payload. Children are real ``os.fork()`` and ``multiprocessing`` (fork start
method) processes; a child that hangs fails the test instead of blocking it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import select
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

import jobrun
from jobrun.job.errors import InheritedPool
from jobrun.job.model import NewJob, new_job_id
from jobrun.postgres.deadline import WATCHDOG
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.store import Store

CHILD_TIMEOUT = 90.0
Checkout = Callable[[], contextlib.AbstractContextManager[psycopg.Connection[Any]]]


# -- running code in a forked child ---------------------------------------------


def _fork() -> int:
    # Python 3.12+ warns about fork() with threads running; that is the case under test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


class Child:
    """A forked child running ``fn``; its JSON-able return value comes back through a pipe."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        read, write = os.pipe()
        self.pid = _fork()
        if self.pid == 0:  # the child: never return into pytest
            try:
                os.close(read)
                try:
                    out = {"result": fn()}
                except BaseException:
                    out = {"error": traceback.format_exc()}
                data = json.dumps(out).encode()
                while data:
                    data = data[os.write(write, data) :]
            finally:
                os._exit(0)
        os.close(write)
        self._read = read

    def result(self, timeout: float = CHILD_TIMEOUT) -> Any:
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._read], [], [], left)[0]:
                    os.kill(self.pid, signal.SIGKILL)
                    pytest.fail(f"the child hung for {timeout:g} s")
                chunk = os.read(self._read, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(self._read)
            os.waitpid(self.pid, 0)
        if not chunks:
            pytest.fail("the child died without a word")
        out = json.loads(b"".join(chunks))
        if "error" in out:
            pytest.fail(f"the child failed:\n{out['error']}")
        return out["result"]


# -- the oracle -----------------------------------------------------------------


def echo_traffic(
    checkouts: list[Checkout], rounds: int, stop: threading.Event | None = None
) -> Any:
    """One thread per checkout, ``rounds`` echo queries each (or until ``stop``)."""
    me = os.getpid()
    wrong: list[Any] = []
    errors: list[str] = []
    backends: set[int] = set()
    answers = [0]
    guard = threading.Lock()

    def run(thread: int, checkout: Checkout) -> None:
        i = 0
        while i < rounds or (stop is not None and not stop.is_set()):
            marker = f"{me}:{thread}:{i}"
            i += 1
            try:
                with checkout() as conn:
                    row = conn.execute("SELECT %s::text, pg_backend_pid()", [marker]).fetchone()
            except Exception as exc:
                with guard:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with guard:
                answers[0] += 1
                if row is None or row[0] != marker:
                    wrong.append([marker, None if row is None else row[0]])
                else:
                    backends.add(row[1])

    threads = [
        threading.Thread(target=run, args=(n, checkout)) for n, checkout in enumerate(checkouts)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "answers": answers[0],
        "wrong": len(wrong),
        "some_wrong": wrong[:5],
        "errors": errors[:5],
        "backends": sorted(backends),
    }


def store_traffic(store: Store, jobs: int) -> Any:
    """Enqueue jobs carrying this process's pid, read each back: ids and payloads must match."""
    me = os.getpid()
    mismatches: list[str] = []
    for i in range(jobs):
        job_id = new_job_id()
        stored = store.enqueue(NewJob(type="fork.test", payload={"pid": me, "i": i}, id=job_id))
        again = store.get(job_id)
        if stored.id != job_id or again.id != job_id or again.payload != {"pid": me, "i": i}:
            mismatches.append(f"{job_id}: {stored.id} {again.id} {again.payload}")
    return mismatches


def both_checkouts(store: Store) -> list[Checkout]:
    """Two threads through the Store's checkout, two straight from its pool."""
    pool = store.pool
    return [
        lambda: store._connection(10.0),
        lambda: store._connection(10.0),
        pool.connection,
        pool.connection,
    ]


def process_traffic(store: Store, rounds: int, jobs: int) -> Any:
    out = echo_traffic(both_checkouts(store), rounds)
    out["store_mismatches"] = store_traffic(store, jobs)
    return out


def assert_clean(out: Any, rounds: int) -> None:
    assert out["wrong"] == 0, out["some_wrong"]
    assert out["errors"] == []
    assert out["answers"] >= rounds


def backend_pids(pool: ConnectionPool[Any], n: int) -> set[int]:
    """The server sessions behind ``n`` connections checked out at once."""
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(pool.connection()) for _ in range(n)]
        return {c.info.backend_pid for c in conns}


def alive(conn: psycopg.Connection[Any], pids: set[int]) -> set[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [sorted(pids)]
    ).fetchall()
    return {r[0] for r in rows}


@contextlib.contextmanager
def parent_traffic(store: Store) -> Iterator[dict[str, Any]]:
    """The parent's echo traffic, running across the fork until the block ends."""
    stop = threading.Event()
    result: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: result.update(echo_traffic(both_checkouts(store), 200, stop))
    )
    thread.start()
    time.sleep(0.3)  # queries in flight, connections checked out, pool locks in use
    try:
        yield result
    finally:
        stop.set()
        thread.join()


# -- the tests ------------------------------------------------------------------

ROUNDS = 1000
JOBS = 200


def test_parent_and_forked_child_each_get_only_their_own_answers(store: Store) -> None:
    with parent_traffic(store) as parent:
        child = Child(lambda: process_traffic(store, ROUNDS, JOBS))
        mine = store_traffic(store, JOBS)
        theirs = child.result()
    assert_clean(theirs, ROUNDS * 4)
    assert theirs["store_mismatches"] == []
    assert_clean(parent, 200 * 4)
    assert mine == []
    assert set(parent["backends"]).isdisjoint(theirs["backends"])


def test_a_forked_child_reopens_the_pool_with_the_parents_settings(store: Store) -> None:
    pool = store.pool
    parents = backend_pids(pool, pool.min_size)

    def child() -> Any:
        with pool.connection() as c:
            row = c.execute(
                "SELECT current_setting('application_name'), current_setting('TimeZone'),"
                " pg_backend_pid()"
            ).fetchone()
            assert row is not None
            return {
                "settings": [row[0], row[1], c.autocommit, pool.min_size, pool.max_size],
                "backend": row[2],
            }

    out = Child(child).result()
    assert out["settings"] == ["jobrun-pool", "UTC", True, pool.min_size, pool.max_size]
    assert out["backend"] not in parents


def test_multiprocessing_children_of_a_client_made_before_the_fork_get_their_own_answers(
    dsn: str,
) -> None:
    # As a web app does at import time, before gunicorn --preload or uwsgi forks.
    client = jobrun.Client.connect(dsn, pool_size=4)
    try:
        client.now()
        ctx = multiprocessing.get_context("fork")
        pipes = []
        procs = []
        with parent_traffic(client.store) as parent:
            for _ in range(2):
                receive, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_mp_child, args=(client, send))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    proc.start()
                send.close()
                pipes.append(receive)
                procs.append(proc)
            results = []
            for receive, proc in zip(pipes, procs, strict=True):
                if not receive.poll(CHILD_TIMEOUT):
                    proc.kill()
                    pytest.fail("a multiprocessing child hung")
                results.append(receive.recv())
                proc.join(CHILD_TIMEOUT)
        for out in results:
            assert "error" not in out, out.get("error")
            assert_clean(out, ROUNDS * 4)
            assert out["store_mismatches"] == []
        assert_clean(parent, 200 * 4)
        seen = [set(parent["backends"])] + [set(out["backends"]) for out in results]
        for i, a in enumerate(seen):
            for b in seen[i + 1 :]:
                assert a.isdisjoint(b)
        # The children closed their client on the way out; the parent is untouched.
        assert_clean(echo_traffic(both_checkouts(client.store), 100), 400)
    finally:
        client.close()


def _mp_child(client: jobrun.Client, send: Any) -> None:
    try:
        out = process_traffic(client.store, ROUNDS, JOBS)
        client.close()  # what an atexit handler or a worker's shutdown does
    except BaseException:
        out = {"error": traceback.format_exc()}
    send.send(out)
    send.close()


def test_a_child_closing_the_inherited_pool_leaves_the_parents_sessions_alive(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    pool = store.pool
    parents = backend_pids(pool, pool.min_size)

    def child() -> float:
        started = time.monotonic()
        pool.close()
        gc.collect()
        return time.monotonic() - started

    assert Child(child).result() < 10.0  # no wait on the parent's threads or locks
    time.sleep(0.5)
    assert alive(conn, parents) == parents
    assert backend_pids(pool, pool.min_size) == parents  # same sessions, still answering
    assert_clean(echo_traffic(both_checkouts(store), 100), 400)


def test_a_connection_held_across_fork_answers_only_the_parent(store: Store) -> None:
    with store.pool.connection() as held:
        held_backend = held.info.backend_pid
        with parent_traffic(store) as parent:
            out = Child(lambda: _held_child(store, held)).result()
            row = held.execute("SELECT %s::text, pg_backend_pid()", ["parent"]).fetchone()
    assert out["got"] is None  # the child could not reach the parent's session
    assert out["backends"] and held_backend not in out["backends"]
    assert row == ("parent", held_backend)
    assert_clean(parent, 200 * 4)


def _held_child(store: Store, held: psycopg.Connection[Any]) -> Any:
    try:
        got = held.execute("SELECT %s::text", ["child"]).fetchone()
    except psycopg.OperationalError:
        got = None
    # The os.fork() child would leave the parent's ``with`` block here, handing
    # the parent's connection back to the pool: it must never be reused.
    store.pool.putconn(held)
    out = echo_traffic(both_checkouts(store), 100)
    assert_clean(out, 400)
    return {"got": got, "backends": out["backends"]}


def test_a_plain_pool_inherited_through_fork_is_refused_with_inherited_pool(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    used = ConnectionPool(dsn, kwargs={"autocommit": True}, min_size=2, open=True)
    unused = ConnectionPool(dsn, kwargs={"autocommit": True}, min_size=2, open=True)
    try:
        used.wait(10)
        unused.wait(10)
        store, fresh_store = Store(used), Store(unused)
        store.now()  # the Store has used this one before the fork; not the other
        parents = backend_pids(used, 2) | backend_pids(unused, 2)

        def child() -> Any:
            refused = []
            for s in (store, fresh_store, fresh_store):
                try:
                    s.now()
                    refused.append("served")
                except InheritedPool as exc:
                    refused.append(str(exc))
            used.close()
            unused.close()
            return refused

        refused = Child(child).result()
        assert all("fork()" in text for text in refused), refused
        assert f"opened in process {os.getpid()}" in refused[0]
        assert "opened in another process" in refused[1]
        assert refused[2] == refused[1]  # and stays refused
        time.sleep(0.5)
        assert alive(conn, parents) == parents
        store.now()
        fresh_store.now()
    finally:
        used.close()
        unused.close()


def test_a_child_does_not_wait_for_the_call_watchdog_of_its_parent(store: Store) -> None:
    # A parent thread is inside the watchdog's lock at the moment of the fork.
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with WATCHDOG._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)

    def child() -> Any:
        started = time.monotonic()
        # The child's own watchdog must start and cut this call at its deadline.
        try:
            with store._connection(0.5) as c:
                c.execute("SELECT pg_sleep(5)")
            outcome = "not interrupted"
        except psycopg.OperationalError:
            outcome = "interrupted"
        return [outcome, time.monotonic() - started]

    try:
        forked = Child(child)
    finally:
        release.set()
        holder.join()
    outcome, took = forked.result(timeout=30)
    assert outcome == "interrupted"
    assert took < 3.0
    assert_clean(echo_traffic(both_checkouts(store), 100), 400)


def test_a_child_cannot_end_the_parents_leader_lock_term(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with AdvisoryLocker(dsn, name="fork-test", check_interval=0) as locker:
        assert locker.try_acquire()
        backend = locker.backend_pid

        def child() -> Any:
            locker.release()  # what a shutdown path inherited by the child would do
            return locker.try_acquire()  # on a session of its own: the parent holds it

        assert Child(child).result() is False
        assert locker.held(force=True)
        holders = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        ).fetchall()
        assert holders == [(backend,)]


def test_a_grandchild_forked_before_the_child_used_the_pool_gets_its_own_too(
    store: Store,
) -> None:
    parents = backend_pids(store.pool, store.pool.min_size)

    def child() -> Any:
        grandchild = Child(lambda: echo_traffic(both_checkouts(store), 100))
        mine = echo_traffic(both_checkouts(store), 100)
        return [mine, grandchild.result()]

    mine, grandchild = Child(child).result()
    for out in (mine, grandchild):
        assert_clean(out, 400)
        assert parents.isdisjoint(out["backends"])
    assert set(mine["backends"]).isdisjoint(grandchild["backends"])
