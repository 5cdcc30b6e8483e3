"""Lost replies, half-open connections, killed listener and leader connections (5, 7, 8, 9)."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import JobrunError, OutcomeUnknown
from jobrun.job.model import NewJob, ScheduleSpec, State
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.faults.app import commit_for
from tests.faults.harness import (
    QUICK_RETRY,
    ROOT,
    TTL,
    NetNamespace,
    Workers,
    backends,
    leader_backend,
    scalar,
    states,
    terminate_role,
    wait_until,
)
from tests.faults.oracle import Oracle, side_log_records
from tests.support.proxy import TcpProxy


@pytest.fixture
def proxied(proxy: TcpProxy) -> Any:
    """A Store whose every connection goes through the proxy."""
    pool = open_pool(proxy.conninfo, concurrency=1, application_name="jobrun-test")
    try:
        yield Store(pool)
    finally:
        pool.close()


# -- 5. the reply to a COMMIT is lost ----------------------------------------------------


def test_a_lost_commit_reply_on_complete_is_outcome_unknown_and_the_retry_applies_nothing_twice(
    proxied: Store, proxy: TcpProxy, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    job = proxied.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY))
    oracle.enqueued([job])
    [claimed] = proxied.claim("owner", ["default"], 1, TTL)
    drop = proxy.drop_reply("COMMIT")
    with pytest.raises(OutcomeUnknown):
        proxied.complete(claimed, commit_for(claimed))
    assert drop.fired.is_set()
    assert scalar(conn, "SELECT state::text FROM jobrun.jobs") == "succeeded"  # it did commit
    # The caller retries with the claim it holds: a defined answer, no second effect.
    assert proxied.complete(claimed, commit_for(claimed)).state is State.SUCCEEDED
    assert scalar(conn, "SELECT count(*) FROM effects") == 1


def test_a_worker_whose_commit_reply_is_lost_completes_the_job_once(
    store: Store, proxy: TcpProxy, conn: psycopg.Connection[Any], workers: Workers, oracle: Oracle
) -> None:
    drop = proxy.drop_reply(
        "COMMIT", role="jobrun-worker", after="INSERT INTO jobrun.processed_effects"
    )
    jobs = [store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY)) for _ in range(3)]
    oracle.enqueued(jobs)
    workers.start(url=proxy.conninfo, concurrency=1)
    wait_until(lambda: states(conn) == {"succeeded": 3}, 60, "the jobs succeed")
    assert drop.fired.is_set()
    assert scalar(conn, "SELECT max(attempts) FROM jobrun.jobs") == 1
    assert scalar(conn, "SELECT count(*) FROM effects") == 3


def test_a_claim_whose_reply_is_lost_runs_on_its_worker_long_before_its_lease_expires(
    store: Store, proxy: TcpProxy, conn: psycopg.Connection[Any], workers: Workers, oracle: Oracle
) -> None:
    """The server commits the claim, the worker only sees its connection die.

    The jobs are leased to a worker that never saw them: without more, no one
    heartbeats or runs them until the lease expires and a reaper (there is
    none here) requeues them with an attempt burned for nothing. The worker
    finds its own lost claims and runs them under the claim that was made.
    """
    jobs = [store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY)) for _ in range(2)]
    oracle.enqueued(jobs)
    # The claim statement (its body is the function of migration 0021).
    drop = proxy.drop_reply("jobrun.claim_jobs(", role="jobrun-worker")
    worker = workers.start(
        url=proxy.conninfo,
        concurrency=2,
        env={"JOBRUN_LEASE_TTL": "60s", "JOBRUN_HEARTBEAT_INTERVAL": "1s"},
    )
    wait_until(drop.fired.is_set, 30, "the first claim's reply is dropped")
    wait_until(
        lambda: states(conn) == {"succeeded": 2},
        20,  # a third of the lease: run by the worker, not after an expiry
        lambda: _diagnosis(conn) + worker.output()[-3000:],
    )
    assert scalar(conn, "SELECT max(attempts) FROM jobrun.jobs") == 1
    assert scalar(conn, "SELECT count(*) FROM effects") == 2
    assert "a claim whose reply was lost" in worker.output()


def test_a_lost_reply_to_a_keyed_enqueue_is_outcome_unknown_and_the_retry_is_deduplicated(
    proxied: Store, proxy: TcpProxy, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    job = NewJob(type="tx.work", idempotency_key="order-7", backoff=QUICK_RETRY)
    proxy.drop_reply("INSERT INTO jobrun.jobs")
    with pytest.raises(OutcomeUnknown):
        proxied.enqueue(job)
    oracle.maybe([job])
    again = proxied.enqueue(job)
    assert again.id == job.id
    assert scalar(conn, "SELECT count(*) FROM jobrun.jobs") == 1
    oracle.enqueued([again])


def test_a_lost_reply_to_an_enqueue_without_key_still_gets_a_defined_answer_on_retry(
    proxied: Store, proxy: TcpProxy, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    """The id is chosen by the client: retrying the same NewJob must not be a raw driver error."""
    job = NewJob(type="tx.work", backoff=QUICK_RETRY)
    proxy.drop_reply("INSERT INTO jobrun.jobs")
    with pytest.raises(OutcomeUnknown):
        proxied.enqueue(job)
    oracle.maybe([job])
    try:
        again = proxied.enqueue(job)
    except JobrunError:
        pass  # a typed answer is defined too
    else:
        assert again.id == job.id
    assert scalar(conn, "SELECT count(*) FROM jobrun.jobs") == 1


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_a_lost_commit_reply_on_a_batch_gets_a_defined_answer_on_retry(
    keyed: bool, proxied: Store, proxy: TcpProxy, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    jobs = [
        NewJob(type="tx.work", idempotency_key=f"b{i}" if keyed else None, backoff=QUICK_RETRY)
        for i in range(20)
    ]
    proxy.drop_reply("COMMIT")
    with pytest.raises(OutcomeUnknown):
        proxied.enqueue_batch(jobs)
    oracle.maybe(jobs)
    try:
        result = proxied.enqueue_batch(jobs)
    except JobrunError:
        assert not keyed, "a keyed batch is deduplicated by its keys"
    else:
        assert result.inserted == 0
        assert {j.id for j in result.replayed} == {j.id for j in jobs}
    assert scalar(conn, "SELECT count(*) FROM jobrun.jobs") == 20


# -- 7. half-open connections -----------------------------------------------------------------


def test_a_half_open_listener_is_noticed_and_replaced_while_jobs_keep_running(
    store: Store, proxy: TcpProxy, conn: psycopg.Connection[Any], workers: Workers, oracle: Oracle
) -> None:
    worker = workers.start(url=proxy.conninfo, concurrency=2)
    wait_until(lambda: proxy.connections("jobrun-listener"), 30, "the listener connects")
    assert proxy.blackhole("jobrun-listener") == 1
    started = time.monotonic()
    # The liveness probe (5 s) plus its bound (5 s) notices; the listener reconnects.
    wait_until(lambda: proxy.connections("jobrun-listener"), 30, "a new listener connection")
    assert time.monotonic() - started < 20
    jobs = [store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY)) for _ in range(5)]
    oracle.enqueued(jobs)
    wait_until(lambda: states(conn) == {"succeeded": 5}, 30, "the jobs run")
    # Said once, by the outage reporter (jobrun.job.outage), naming the listener.
    assert " unavailable: listener " in worker.output(), worker.output()[-4000:]


def test_a_half_open_leader_steps_down_and_no_cron_occurrence_runs_twice(
    store: Store, proxy: TcpProxy, conn: psycopg.Connection[Any], workers: Workers, oracle: Oracle
) -> None:
    store.create_schedule(ScheduleSpec(id="every-second", cron="* * * * * *", type="tx.tick"))
    procs = [workers.start(url=proxy.conninfo, scheduler=True, concurrency=2) for _ in range(2)]
    wait_until(lambda: leader_backend(conn), 30, "a leader is elected")
    wait_until(lambda: scalar(conn, "SELECT count(*) FROM effects") >= 2, 30, "cron runs")
    leader = wait_until(
        lambda: next((p for p in procs if "elected leader" in p.output()), None), 10, "who leads"
    )
    proxy.blackhole("jobrun-leader")
    # Its bounded probe fails: it steps down while the server still holds its session.
    wait_until(lambda: "no longer the leader" in leader.output(), 20, "the leader steps down")
    for _ in range(10):
        leader_backend(conn)  # never two sessions holding the lock
        time.sleep(0.2)
    proxy.cut()  # the server ends the half-open session: the lock is free
    before = scalar(conn, "SELECT count(*) FROM effects")
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM effects") >= before + 3, 60, "cron resumes"
    )
    keys = conn.execute("SELECT idempotency_key FROM jobrun.jobs WHERE type = 'tx.tick'").fetchall()
    assert len(keys) == len(set(keys))


def test_a_worker_whose_pool_connections_go_half_open_recovers_within_a_bound(
    store: Store, proxy: TcpProxy, conn: psycopg.Connection[Any], workers: Workers, oracle: Oracle
) -> None:
    """Every call on a pooled connection is bounded client-side: no thread hangs forever."""
    worker = workers.start(url=proxy.conninfo, concurrency=2)
    first = [store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY)) for _ in range(4)]
    oracle.enqueued(first)
    wait_until(lambda: states(conn) == {"succeeded": 4}, 30, "the first jobs run")
    assert proxy.blackhole("jobrun-worker") >= 1  # every pooled connection, idle or busy
    later = [store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY)) for _ in range(4)]
    oracle.enqueued(later)
    wait_until(
        lambda: states(conn) == {"succeeded": 8},
        60,
        "the half-open worker runs new jobs on fresh connections (its calls are bounded)\n"
        + worker.output()[-3000:],
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(40) == 0


def test_a_completion_stuck_on_a_half_open_connection_is_given_up_within_its_lease(
    store: Store,
    proxy: TcpProxy,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Any,
    oracle: Oracle,
) -> None:
    """The completer never waits past the lease it completes: it used to wait
    call_timeout + commit_timeout (here 60 s) on a half-open connection while
    the job was reaped and run again elsewhere after its 5 s lease. (A batch
    with commit callables keeps commit_timeout for its first try: it holds
    the rows locked while the callables run, which may outlast the lease;
    see test_heartbeats_and_the_reaper_are_not_starved_* in test_database.)"""
    worker = workers.start(
        url=proxy.conninfo,
        concurrency=1,
        env={
            "JOBRUN_LEASE_TTL": "5s",
            "JOBRUN_CALL_TIMEOUT": "30s",
            "JOBRUN_COMMIT_TIMEOUT": "30s",
        },
    )
    job = store.enqueue(
        NewJob(type="plain.work", payload={"sleep": 1, "honour_cancel": False}, backoff=QUICK_RETRY)
    )
    oracle.enqueued([job])
    wait_until(
        lambda: any(r["event"] == "start" for r in side_log_records(side_log)),
        30,
        "the handler runs",
    )
    # Half-open while the handler sleeps: its completion (and every other
    # call of the worker) waits for answers that never come.
    proxy.hold_new()
    assert proxy.blackhole("jobrun-worker") >= 1
    began = time.monotonic()
    wait_until(
        lambda: "given up: their lease ran out" in worker.output(),
        40,
        "the completer gives the completion up",
    )
    elapsed = time.monotonic() - began
    assert elapsed < 5 + 3, (elapsed, worker.output()[-3000:])
    # The network heals; the job is the reaper's, and runs once more elsewhere.
    proxy.hold_new(False)
    proxy.cut()
    workers.start(scheduler=True)
    wait_until(lambda: states(conn) == {"succeeded": 1}, 60, "the job runs again elsewhere")
    assert store.get(job.id).attempts == 2
    worker.signal(signal.SIGTERM)
    assert worker.wait(40) == 0, worker.output()[-3000:]
    oracle.watch(oracle.default_url, settled=True)


@pytest.fixture
def cable() -> Any:
    reason = NetNamespace.available()
    if reason is not None:
        pytest.skip(reason)  # an environment limit (no root), not a jobrun outcome
    ns = NetNamespace()
    try:
        yield ns
    finally:
        ns.close()


def test_a_worker_cut_off_by_a_silent_network_bounds_its_calls_and_recovers(
    store: Store,
    dsn: str,
    cable: NetNamespace,
    conn: psycopg.Connection[Any],
    workers: Workers,
    oracle: Oracle,
) -> None:
    """A real half-open network: the kernel drops every packet, nothing answers, no RST.

    A call already waiting on the server is bounded by TCP keepalives; one
    that sends into the dead link has unacknowledged data, which keepalives
    ignore, so only ``tcp_user_timeout`` (or a deadline of jobrun's own)
    bounds it. With the default lease (30 s, heartbeat every 5 s) the
    heartbeat must fail within the lease, so that the worker can stop its
    handlers before their jobs are reaped and run elsewhere.

    A claim the worker gave up on while the cable was out can still reach the
    server once it is back (TCP delivers what the dead link held) and lease
    one of the later jobs to the worker behind its back: the worker must find
    and run it, as no reaper runs here (issue 10).
    """
    with TcpProxy(dsn, listen_host=cable.host) as proxy:
        worker = workers.start(
            url=proxy.conninfo,
            concurrency=2,
            netns=cable.name,
            env={"JOBRUN_LEASE_TTL": "30s", "JOBRUN_HEARTBEAT_INTERVAL": "5s"},
        )
        long = store.enqueue(NewJob(type="plain.work", payload={"sleep": 300}))
        quick = [store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY)) for _ in range(3)]
        oracle.enqueued([long, *quick])
        wait_until(lambda: states(conn).get("succeeded") == 3, 30, worker.output)
        cable.down()
        pulled = time.monotonic()
        bound = 30 + 5 + 5
        try:
            # The worker's calls fail instead of hanging: the outage reporter says so.
            wait_until(
                lambda: " unavailable: " in worker.output(),
                bound,
                lambda: "the worker's calls fail instead of hanging\n" + worker.output()[-2000:],
                interval=0.5,
            )
            print(f"\nfirst failure {time.monotonic() - pulled:.1f} s after the cable was pulled")
            # The cable stays out for the whole bound: the heartbeat fails within it.
            time.sleep(max(0.0, pulled + bound - time.monotonic()))
        finally:
            cable.up()
        # Once back, the reporter counts the failures by loop: the heartbeat's among them.
        wait_until(
            lambda: re.search(r"available again after .*heartbeat \d+", worker.output()),
            60,
            lambda: "the heartbeat failed while the cable was out\n" + worker.output()[-2000:],
            interval=0.5,
        )
        store.cancel(long.id)
        later = [store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY)) for _ in range(3)]
        oracle.enqueued(later)
        wait_until(
            lambda: states(conn).get("succeeded") == 6,
            60,
            lambda: _diagnosis(conn) + worker.output()[-4000:],
        )


def _diagnosis(conn: psycopg.Connection[Any]) -> str:
    """The jobs and the sessions in the test's database, for a failure message."""
    jobs = conn.execute(
        "SELECT j.id, j.type, j.state::text, j.attempts, j.lease_expires_at, j.updated_at,"
        " (SELECT string_agg(e.kind::text || '@' || e.at::time::text, ' ' ORDER BY e.id)"
        "  FROM jobrun.job_events e WHERE e.job_id = j.id)"
        " FROM jobrun.jobs j ORDER BY j.created_at"
    ).fetchall()
    sessions = conn.execute(
        "SELECT pid, application_name, state, xact_start, wait_event_type, wait_event,"
        " left(query, 100) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    locks = conn.execute(
        "SELECT l.pid, l.locktype, l.relation::regclass::text, l.mode, l.granted"
        " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE a.datname = current_database() AND l.locktype <> 'virtualxid'"
        " AND a.pid <> pg_backend_pid()"
    ).fetchall()
    lines = [
        f"at {scalar(conn, 'SELECT clock_timestamp()')}",
        "jobs:",
        *map(str, jobs),
        "sessions:",
        *map(str, sessions),
        "locks:",
        *map(str, locks),
    ]
    return "\n".join(lines) + "\n"


_GIVE_UP_CLIENT = """
import sys
import psycopg
from jobrun.postgres.deadline import WATCHDOG

conn = psycopg.connect(sys.argv[1], autocommit=True, application_name="test-give-up")
conn.execute("SELECT 1")
print("ready", flush=True)
sys.stdin.readline()
try:
    with WATCHDOG.watch(conn, 2.0):
        conn.execute("INSERT INTO ghost VALUES (1)")
except psycopg.Error as exc:
    print("gave up:", type(exc).__name__, flush=True)
else:
    print("answered", flush=True)
conn.close()  # as the pool does with a broken connection
sys.stdin.readline()
"""


def test_a_statement_the_watchdog_gave_up_on_never_runs_once_the_network_heals(
    dsn: str, cable: NetNamespace, conn: psycopg.Connection[Any]
) -> None:
    """Giving up on a call must make it never happen, not happen later.

    The caller was told the connection is gone (for a claim: no job was
    handed to it), so a request still queued in the kernel must not reach
    the server once the link comes back: a claim delivered then leases jobs
    to a worker that does not know it holds them.
    """
    conn.execute("CREATE TABLE ghost (n int)")
    with TcpProxy(dsn, listen_host=cable.host) as proxy:
        command = ["ip", "netns", "exec", cable.name, sys.executable, "-c", _GIVE_UP_CLIENT]
        with subprocess.Popen(
            [*command, proxy.conninfo],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        ) as client:
            try:
                assert client.stdin is not None and client.stdout is not None
                assert client.stdout.readline().strip() == "ready"
                cable.down()
                client.stdin.write("go\n")
                client.stdin.flush()
                assert client.stdout.readline().startswith("gave up")
                # Packets handed to the network before it gave up may still
                # arrive (the kernel queues them while it resolves the peer's
                # address, about 3 s): wait those out. What must not arrive is
                # what TCP would send afterwards (it retransmits for as long as
                # the socket lives: tcp_user_timeout, or about 15 minutes).
                time.sleep(4)
                cable.up()
                deadline = time.monotonic() + 12
                while time.monotonic() < deadline:
                    assert scalar(conn, "SELECT count(*) FROM ghost") == 0, "it ran after all"
                    time.sleep(0.2)
            finally:
                client.kill()


# -- 8. the listener killed; notifications off ------------------------------------------------


def _latencies(conn: psycopg.Connection[Any]) -> list[float]:
    rows = conn.execute(
        "SELECT extract(epoch FROM c.at - e.at) FROM jobrun.job_events e"
        " JOIN jobrun.job_events c ON c.job_id = e.job_id AND c.kind = 'claimed'"
        " WHERE e.kind = 'enqueued' ORDER BY e.id"
    ).fetchall()
    return [float(r[0]) for r in rows]


def test_a_job_enqueued_while_the_listener_is_dead_runs_within_one_poll_interval(
    store: Store, conn: psycopg.Connection[Any], workers: Workers, oracle: Oracle
) -> None:
    workers.start(env={"JOBRUN_POLL_INTERVAL": "2s"})
    wait_until(lambda: backends(conn, "jobrun-listener"), 30, "the listener connects")
    killed = terminate_role(conn, "jobrun-listener")
    assert len(killed) == 1
    job = store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY))  # its NOTIFY is lost
    oracle.enqueued([job])
    wait_until(lambda: store.get(job.id).state is State.SUCCEEDED, 15, "the job runs")
    assert _latencies(conn)[0] <= 2.0 + 1.0
    wait_until(
        lambda: [p for p in backends(conn, "jobrun-listener") if p not in killed],
        30,
        "the listener reconnects",
    )


def test_with_notifications_off_jobs_run_by_polling_within_one_poll_interval(
    store: Store, conn: psycopg.Connection[Any], workers: Workers, oracle: Oracle
) -> None:
    workers.start(env={"JOBRUN_NOTIFICATIONS": "off", "JOBRUN_POLL_INTERVAL": "1s"})
    time.sleep(1.5)
    assert backends(conn, "jobrun-listener") == []
    for _ in range(4):
        job = store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY))
        oracle.enqueued([job])
        wait_until(lambda job=job: store.get(job.id).state is State.SUCCEEDED, 15, "polled")
        time.sleep(0.3)
    assert max(_latencies(conn)) <= 1.0 + 1.0


# -- 9. the leader's lock connection killed -----------------------------------------------------


def test_killing_the_leaders_lock_connection_moves_leadership_without_a_duplicate_occurrence(
    store: Store, conn: psycopg.Connection[Any], workers: Workers, oracle: Oracle
) -> None:
    store.create_schedule(ScheduleSpec(id="every-second", cron="* * * * * *", type="tx.tick"))
    procs = [workers.start(scheduler=True, concurrency=2) for _ in range(2)]
    old = wait_until(lambda: leader_backend(conn), 30, "a leader is elected")
    wait_until(lambda: scalar(conn, "SELECT count(*) FROM effects") >= 3, 30, "cron runs")
    assert terminate_role(conn, "jobrun-leader") and old  # the waiting one has no lock to lose
    new = wait_until(lambda: (leader_backend(conn) or old) != old, 30, "a new term starts")
    assert new
    wait_until(
        lambda: sum("no longer the leader" in p.output() for p in procs) == 1,
        20,
        "the old leader steps down",
    )
    before = scalar(conn, "SELECT count(*) FROM effects")
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        leader_backend(conn)  # asserts at most one holder
        time.sleep(0.1)
    assert scalar(conn, "SELECT count(*) FROM effects") >= before + 2
    keys = conn.execute("SELECT idempotency_key FROM jobrun.jobs WHERE type = 'tx.tick'").fetchall()
    assert len(keys) == len(set(keys))
    runs = conn.execute(
        "SELECT run_at FROM jobrun.jobs WHERE type = 'tx.tick' ORDER BY run_at"
    ).fetchall()
    assert len(runs) == len({r[0] for r in runs})
    assert dt.timedelta(0) not in {b[0] - a[0] for a, b in itertools.pairwise(runs)}
