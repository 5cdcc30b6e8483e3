"""Workflows and durable steps under faults (issue 29, "Correctness and speed").

- many small fan-ins (a root, a few parents on the two worker processes,
  one fan-in), the workers kill -9'd again and again and a PostgreSQL
  restart in the middle of the run: every job's effect exactly once, every
  fan-in released exactly once, none stranded ``waiting``;
- a worker frozen (SIGSTOP) past the lease of a fan-in's parent: the parent
  runs again elsewhere, the fan-in fires once, the frozen run's late
  completion is refused;
- durable steps under kill -9: the transactional steps' effects exactly
  once, a recorded step never run again by a later attempt, the plain
  step's stored value the one every later step saw.

The oracle (tests/faults/oracle.py) checks its properties after each test,
the dependency one included (no job waiting for parents that finished, no
edge of a finished parent left uncounted, no child released twice).

Sizes: ``JOBRUN_FAULTS_WORKFLOWS`` fan-ins (default 40, the CI size; 200 is
the full run) and ``JOBRUN_FAULTS_STEP_JOBS`` step jobs (default 12).
"""

from __future__ import annotations

import collections
import os
import re
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

import jobrun
from jobrun.job.model import Backoff, NewJob, State
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.faults.harness import (
    Reaper,
    WorkerProc,
    Workers,
    backends,
    scalar,
    states,
    wait_until,
)
from tests.faults.oracle import Oracle, side_log_records
from tests.faults.test_database import cluster_db
from tests.faults.workflow_app import STEP_EFFECTS_DDL, TX_STEPS

APP = ("--app", "tests.faults.workflow_app:registry")
FANINS = int(os.environ.get("JOBRUN_FAULTS_WORKFLOWS", "40"))
STEP_JOBS = int(os.environ.get("JOBRUN_FAULTS_STEP_JOBS", "12"))
STEP_KILLS = 8
PAUSE = 0.4
"""A step job's pause before each transactional step and inside its plain step."""
PARENTS = 2
KILLS = max(FANINS // 10, 3)
"""kill -9s before the restart, and as many after it (at most: until the run is done)."""
RETRY = Backoff(kind="constant", base=0.0, jitter=0.0)
ATTEMPTS = 100
"""Every kill burns the attempts of the jobs its worker ran: never run out."""


def job(type_: str = "tx.work", **payload: Any) -> NewJob:
    return NewJob(type=type_, payload=payload, max_attempts=ATTEMPTS, backoff=RETRY)


SIDES = ("left", "right")
"""The parents' queues: one worker process works each (and the default queue), so the
last parents of a fan-in, released together and as long, finish together on two workers."""


def fan_in(n: int, sleep: float) -> jobrun.Workflow:
    """A root, ``PARENTS`` parents after it (one on each side, returning at the same
    instant of the host's clock), a fan-in."""
    flow = jobrun.Workflow(f"fan-in {n}")
    root = flow.add(job(sleep=sleep), name="root")
    parents = flow.group(
        [
            NewJob(
                type="tx.aligned",
                queue=SIDES[i % 2],
                payload={"align": sleep},
                max_attempts=ATTEMPTS,
                backoff=RETRY,
            )
            for i in range(PARENTS)
        ],
        after=[root],
    )
    flow.add(job(sleep=sleep), after=parents, name="fan-in")
    return flow


class Churn:
    """Worker processes (one per ``queues`` spec), the oldest kill -9'd and started again
    with its queues every ``every`` seconds."""

    def __init__(self, workers: Workers, queues: list[str], **options: Any) -> None:
        self.workers = workers
        self.options = options
        self.procs = [(self._start(q), q) for q in queues]
        self.kills = 0

    def _start(self, queues: str) -> WorkerProc:
        return self.workers.start(*APP, "--queues", queues, **self.options)

    def kill_one(self) -> WorkerProc:
        return self.kill(self.procs[0][0])

    def kill(self, victim: WorkerProc) -> WorkerProc:
        [(_, queues)] = [(p, q) for p, q in self.procs if p is victim]
        self.procs = [(p, q) for p, q in self.procs if p is not victim]
        victim.kill9()
        self.kills += 1
        self.procs.append((self._start(queues), queues))
        return victim

    def run(self, until: Callable[[], bool], every: float, kills: int) -> None:
        while self.kills < kills and not until():
            time.sleep(every)
            self.kill_one()


def released(conn: psycopg.Connection[Any]) -> collections.Counter[Any]:
    return collections.Counter(
        r[0]
        for r in conn.execute(
            "SELECT job_id FROM jobrun.job_events WHERE kind = 'released'"
            " AND detail->>'via' = 'dependency'"
        ).fetchall()
    )


def races(conn: psycopg.Connection[Any]) -> int:
    """Fan-ins whose last parent on each side (two worker processes) committed within 50 ms
    of the other's (the effects' clock_timestamp(), inside each Complete transaction)."""
    row = conn.execute(
        "SELECT count(*) FROM ("
        "  SELECT max(e.at) FILTER (WHERE p.queue = 'left') AS l,"
        "         max(e.at) FILTER (WHERE p.queue = 'right') AS r"
        "  FROM jobrun.jobs c JOIN jobrun.job_dependencies d ON d.child_id = c.id"
        "  JOIN jobrun.jobs p ON p.id = d.parent_id JOIN effects e ON e.job_id = p.id"
        "  WHERE c.workflow_node = 'fan-in' GROUP BY c.id) AS sides"
        " WHERE abs(extract(epoch FROM l - r)) < 0.05"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_fan_ins_under_repeated_kill_9_and_a_postgres_restart_fire_once_and_strand_nothing(
    tmp_path: Path, side_log: Path, oracle: Oracle
) -> None:
    with cluster_db(oracle) as (cluster, url):
        workers = Workers(url, tmp_path, side_log)
        pool = open_pool(url, concurrency=1, application_name="jobrun-test")
        store = Store(pool)
        client = jobrun.Client(store)
        try:
            with Reaper(store) as reaper:
                churn = Churn(workers, [f"{side},default" for side in SIDES], concurrency=8)
                with psycopg.connect(url, autocommit=True) as c:
                    # Both sides ready before the parents are released.
                    wait_until(lambda: len(backends(c, "jobrun-listener")) == 2, 30, "listeners")
                runs = [client.enqueue_workflow(fan_in(n, sleep=0.5)) for n in range(FANINS)]
                every_job = [j for run in runs for j in run]
                oracle.enqueued(every_job, url=url)
                total = len(every_job)

                def succeeded() -> int:  # -1 while the server restarts
                    return int(scalar(url, "SELECT count(*) FROM effects"))

                def done() -> bool:
                    return (
                        succeeded() == total
                        and scalar(
                            url, "SELECT count(*) FROM jobrun.jobs WHERE state <> 'succeeded'"
                        )
                        == 0
                    )

                wait_until(lambda: succeeded() >= total // 10, 60, "a first tenth done")
                churn.run(lambda: succeeded() >= total // 2, every=1.0, kills=KILLS)
                cluster.restart("immediate")  # mid-run, killed workers' leases still open
                churn.run(done, every=1.0, kills=churn.kills + KILLS)
                wait_until(done, 120, lambda: f"all {total} jobs succeed\n{workers.outputs()}")
            with psycopg.connect(url, autocommit=True) as c:
                counted = released(c)
                fan_ins = [run["fan-in"].id for run in runs]
                children = [j.id for j in every_job if j.workflow_node != "root"]
                # Every child and fan-in released once; every job's effect once (oracle).
                assert {k: counted[k] for k in children} == dict.fromkeys(children, 1)
                assert set(counted) == set(children)
                assert scalar(c, "SELECT count(*) FROM effects") == total
                assert scalar(
                    c, "SELECT count(DISTINCT job_id) FROM effects WHERE job_id = ANY(%s)", fan_ins
                ) == len(fan_ins)
                raced = races(c)
                reaped = scalar(c, "SELECT count(*) FROM jobrun.job_events WHERE kind = 'reaped'")
                print(
                    f"{FANINS} fan-ins ({total} jobs): {churn.kills} kill -9, 1 restart,"
                    f" {reaped} leases reaped ({reaper.requeued} by the test's reaper),"
                    f" {raced} fan-ins whose last two parents committed on two processes"
                    " within 50 ms"
                )
                assert churn.kills >= 3
                assert raced >= 1, "\n".join(
                    str(r)
                    for r in c.execute(
                        "SELECT c.id, p.queue, e.pid, e.at FROM jobrun.jobs c"
                        " JOIN jobrun.job_dependencies d ON d.child_id = c.id"
                        " JOIN jobrun.jobs p ON p.id = d.parent_id JOIN effects e"
                        " ON e.job_id = p.id WHERE c.workflow_node = 'fan-in' ORDER BY 1, 4"
                        " LIMIT 12"
                    )
                )
            oracle.watch(url, settled=True)
        finally:
            workers.kill_all()
            pool.close()


def test_a_parent_frozen_past_its_lease_is_fenced_and_its_fan_in_fires_once(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Path,
    oracle: Oracle,
) -> None:
    client = jobrun.Client(store)
    flow = jobrun.Workflow("frozen parent")
    slow = flow.add(
        job(sleep=2, sleep_attempts=[1], honour_cancel=False), name="slow"
    )  # attempt 1 outlives its lease while frozen
    quick = flow.add(job(), name="quick")
    flow.add(job(), after=[slow, quick], name="fan-in")
    run = client.enqueue_workflow(flow)
    oracle.enqueued(run)
    # A commit_timeout of 2 s: when the freeze lands inside the quick parent's
    # Complete (its row locked, its commit callable running), the server ends
    # that silent transaction after 2 s instead of the default 30.
    stale = workers.start(*APP, concurrency=2, env={"JOBRUN_COMMIT_TIMEOUT": "2s"})
    wait_until(
        lambda: any(
            r["event"] == "start" and r["job"] == str(run["slow"].id)
            for r in side_log_records(side_log)
        ),
        30,
        "the slow parent runs",
    )
    stale.stop()  # SIGSTOP: no heartbeat; the lease runs out
    reaped = wait_until(
        lambda: store.reap_expired(store.now(), 10).requeued, 30, "the slow parent's lease reaped"
    )
    assert run["slow"].id in reaped
    fresh = workers.start(*APP, concurrency=2)
    fan = run["fan-in"].id
    with Reaper(store):  # the quick parent too, when the frozen worker had it leased
        wait_until(lambda: store.get(fan).state is State.SUCCEEDED, 30, "the fan-in runs")
    before = {j.id: store.get(j.id) for j in run}
    events_before = scalar(conn, "SELECT count(*) FROM jobrun.job_events")
    stale.cont()  # the frozen run wakes up, finishes its handler and tries to complete
    wait_until(
        lambda: re.search(r"lease lost|lost their lease", stale.output()),
        30,
        lambda: "the stale owner is told its lease is lost\n" + stale.output()[-2000:],
    )
    assert {j.id: store.get(j.id) for j in run} == before
    assert scalar(conn, "SELECT count(*) FROM jobrun.job_events") == events_before
    assert released(conn)[fan] == 1
    assert conn.execute(
        "SELECT job_id, pid FROM effects WHERE job_id = ANY(%s) ORDER BY job_id",
        [[run["slow"].id, fan]],
    ).fetchall() == sorted([(run["slow"].id, fresh.pid), (fan, fresh.pid)])
    oracle.watch(oracle.default_url, settled=True)


def test_durable_steps_under_kill_9_write_once_and_a_recorded_step_never_runs_again(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Path,
    oracle: Oracle,
) -> None:
    conn.execute(STEP_EFFECTS_DDL)
    jobs = [store.enqueue(job("tx.steps", pause=PAUSE)) for _ in range(STEP_JOBS)]
    oracle.enqueued(jobs)
    ids = [j.id for j in jobs]
    with Reaper(store):
        churn = Churn(workers, ["default", "default"], concurrency=4)

        def done() -> bool:
            return bool(states(conn) == {"succeeded": len(jobs)})

        def inside(step: str) -> WorkerProc | None:
            """A live worker that began ``step`` of some job less than half a pause ago."""
            now = time.time()
            pids = {
                r["pid"]
                for r in side_log_records(side_log)
                if r["event"] == "step" and r["step"] == step and now - r["t"] < PAUSE / 2
            }
            return next((p for p, _ in churn.procs if p.pid in pids and p.alive()), None)

        def inside_or_done(step: str) -> WorkerProc | bool:
            return inside(step) or done()

        # Each kill lands inside a step, in turn: the plain one (its effect done, its
        # checkpoint not), then each transactional one (its transaction open).
        for step in ("fetch", "t1", "t2", "t3") * (STEP_KILLS // 4):
            if done():
                break
            victim = wait_until(partial(inside_or_done, step), 30, f"a run in {step}")
            if isinstance(victim, WorkerProc):
                churn.kill(victim)
        wait_until(done, 90, lambda: f"every step job succeeds: {states(conn)}")
    steps = {
        (r[0], r[1]): (r[2], r[3])
        for r in conn.execute("SELECT job_id, name, attempt, result FROM jobrun.job_steps")
    }
    assert len(steps) == len(jobs) * (1 + len(TX_STEPS))
    # The transactional steps' effects: exactly once, by the attempt that recorded them,
    # with the plain step's stored value (never a re-run's fresh one).
    written = collections.Counter(
        (r[0], r[1]) for r in conn.execute("SELECT job_id, step FROM step_effects")
    )
    assert written == {(i, s): 1 for i in ids for s in TX_STEPS}
    for job_id, step, attempt, nonce in conn.execute(
        "SELECT job_id, step, attempt, nonce FROM step_effects"
    ):
        assert steps[(job_id, step)][0] == attempt
        assert steps[(job_id, "fetch")][1]["nonce"] == nonce
    # A retried attempt never re-runs a recorded step (the side log's runs of each step).
    runs = [r for r in side_log_records(side_log) if r["event"] == "step"]
    for r in runs:
        recorded_by = steps[(uuid.UUID(r["job"]), r["step"])][0]
        assert r["attempt"] <= recorded_by, f"step run again after it was recorded: {r}"
    retried = {uuid.UUID(r["job"]) for r in runs if r["attempt"] > 1}
    reran_plain = sum(
        1
        for r in runs
        if r["step"] == "fetch" and r["attempt"] < steps[(uuid.UUID(r["job"]), "fetch")][0]
    )
    rolled_back = sum(
        1
        for r in runs
        if r["step"] != "fetch" and r["attempt"] < steps[(uuid.UUID(r["job"]), r["step"])][0]
    )
    print(
        f"{len(jobs)} step jobs, {churn.kills} kill -9: {len(retried)} jobs ran steps on a"
        f" later attempt, {reran_plain} plain step run(s) lost to a kill and run again,"
        f" {rolled_back} transactional step run(s) rolled back by a kill"
    )
    assert reran_plain >= 1, "no kill landed inside the plain step"
    # The plain step's own effect (its side-log record) is at-least-once: a run killed
    # before its checkpoint is run again; once recorded, never (asserted above).
    assert churn.kills >= 3
    assert retried, "no kill landed inside a job of steps"
    oracle.watch(oracle.default_url, settled=True)
