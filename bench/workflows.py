"""Workflow figures (issue 29): what a graph costs per node, and how soon a fan-in starts.

Every run, on one worker process at ``wf_concurrency`` threads (no-op
handlers, ``bench.noop``, the batched completion path):

- ``workflows.plain``: a drain of ``wf_plain_jobs`` plain jobs before the
  graphs and another after them, averaged: the baseline cost per job, CPU
  seconds of the worker process and of the server (from /proc) over the
  drain, per job (bracketing the graphs, so that the machine drifting over
  a run weighs on both sides of the ratios alike);
- ``workflows.fanout``: one workflow, a root, ``wf_fanout`` children after
  it and one fan-in after every child; ``workflows.chains``: ``wf_chains``
  workflows side by side, each a chain of ``wf_chain_length`` jobs (one
  after the other: at most ``wf_chains`` runnable at once; 32, one per
  thread, by default). Enqueued on a paused queue, the worker started and
  ready, the queue resumed; cost per node = CPU seconds / nodes as above.
  ``.ratio``: that cost / the plain drain's per job in the same run (target
  <= 1.5); ``.wall_ratio``: the same with wall time (first ``claimed``
  event to last ``finished_at``, database clock), no target: a chain's is
  its links' latency, not its cost;
- ``workflows.fanin_pickup``: ``wf_fanins`` small fan-ins (two parents, one
  fan-in) enqueued one by one at ``wf_fanin_rate`` per second to an idle
  worker; latency = the fan-in's ``started_at`` (its attempt's start) - the
  later of its parents' ``finished_at`` (the transaction that released it),
  both the database's clock (target p50 <= 50 ms).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jobrun
from bench import measure
from bench.stats import Figure, at_most, percentile
from jobrun import NewJob

if TYPE_CHECKING:
    from bench.measure import Context

QUEUE = "drain"
NOOP = "bench.noop"
TARGET_RATIO = 1.5
TARGET_PICKUP_MS = 50.0

FANIN_LATENCY = """
SELECT extract(epoch FROM f.started_at - max(p.finished_at)) * 1000
FROM jobrun.jobs f
JOIN jobrun.job_dependencies d ON d.child_id = f.id
JOIN jobrun.jobs p ON p.id = d.parent_id
WHERE f.workflow_node = 'fan-in' AND f.queue = %s
GROUP BY f.id, f.started_at
"""


def _reset(ctx: Context) -> None:
    ctx.db.reset()  # the tables of every measurement; the graph's three here
    ctx.db.execute("TRUNCATE jobrun.job_dependencies, jobrun.workflows, jobrun.workflow_jobs")


def _job() -> NewJob:
    return NewJob(type=NOOP, queue=QUEUE)


def fanout(children: int) -> jobrun.Workflow:
    flow = jobrun.Workflow(f"fan-out of {children}")
    root = flow.add(_job(), name="root")
    group = flow.group([_job() for _ in range(children)], after=[root])
    flow.add(_job(), after=group, name="fan-in")
    return flow


def chain(n: int, length: int) -> jobrun.Workflow:
    flow = jobrun.Workflow(f"chain {n} of {length}")
    flow.chain(*[_job() for _ in range(length)])
    return flow


FANOUT_PHASES = """
WITH r AS (SELECT * FROM jobrun.jobs WHERE workflow_node = 'root'),
     f AS (SELECT * FROM jobrun.jobs WHERE workflow_node = 'fan-in'),
     c AS (SELECT min(started_at) AS first, max(finished_at) AS last FROM jobrun.jobs
           WHERE workflow_node NOT IN ('root', 'fan-in')),
     e AS (SELECT min(at) AS at FROM jobrun.job_events WHERE kind = 'claimed')
SELECT extract(epoch FROM r.finished_at - e.at), extract(epoch FROM c.first - r.finished_at),
       extract(epoch FROM c.last - c.first), extract(epoch FROM f.started_at - c.last),
       extract(epoch FROM f.finished_at - f.started_at)
FROM r, f, c, e
"""
"""Where a fan-out's time goes (seconds): the root's run from the first claim, the
release of its children to the first child's start, the children's drain, the
fan-in's start after the last child, the fan-in's run."""


CHAIN_LINKS = """
SELECT percentile_cont(0.5) WITHIN GROUP
           (ORDER BY extract(epoch FROM c.started_at - p.finished_at)),
       percentile_cont(0.5) WITHIN GROUP
           (ORDER BY extract(epoch FROM c.finished_at - c.started_at))
FROM jobrun.job_dependencies d
JOIN jobrun.jobs c ON c.id = d.child_id
JOIN jobrun.jobs p ON p.id = d.parent_id
"""
"""A chain's link, medians in seconds: from a parent's finished_at to its child's
start (release, wake-up, claim), and from a start to its finished_at (the run and
the completion's commit)."""


@dataclasses.dataclass(frozen=True)
class Drained:
    """A drain's wall time and CPU time (worker + server) per node, in seconds."""

    wall: float
    cpu: float
    cpu_worker: float
    cpu_server: float


def _drain(ctx: Context, enqueue: Callable[[jobrun.Client], int], concurrency: int) -> Drained:
    """Drain what ``enqueue`` puts on the paused queue (it returns how many nodes):
    wall seconds per node (first claim to last finish, database clock), and the
    worker's and the server's CPU seconds per node meanwhile (from /proc)."""
    _reset(ctx)
    client = jobrun.Client(ctx.store)
    ctx.store.pause_queue(QUEUE)
    nodes = enqueue(client)
    ctx.db.execute("VACUUM ANALYZE jobrun.jobs, jobrun.job_events, jobrun.job_dependencies")
    # The writes so far (the enqueue, the vacuum) flushed now, not by a checkpoint
    # that would land in one drain's window and not another's.
    ctx.db.checkpoint()
    with measure.workers(ctx, QUEUE, concurrency, 1) as w:
        w.wait_ready()
        ctx.db.reset_statements()
        worker0, server0 = w.cpu_seconds(), ctx.db.server_cpu_seconds()
        ctx.store.resume_queue(QUEUE)
        measure._wait_drained(ctx, w, QUEUE, timeout=max(600.0, nodes / 20))
        worker1, server1 = w.cpu_seconds(), ctx.db.server_cpu_seconds()
        for top in ctx.db.top_statements(6):  # with --statements only
            per_node = top["total_ms"] / nodes * 1000
            plan = top["plan_ms"] / nodes * 1000
            ctx.say(
                f"    {per_node:7.1f} µs/node (+{plan:5.1f} planning) {top['calls']:>7} calls"
                f"  {top['query'][:100]}"
            )
    first, last, done, left = ctx.db.execute(
        "SELECT (SELECT min(at) FROM jobrun.job_events WHERE kind = 'claimed'),"
        " (SELECT max(finished_at) FROM jobrun.jobs WHERE queue = %s),"
        " (SELECT count(*) FROM jobrun.jobs WHERE queue = %s AND state = 'succeeded'),"
        " (SELECT count(*) FROM jobrun.jobs WHERE state = 'waiting')",
        [QUEUE, QUEUE],
    )[0]
    if done != nodes or left:
        raise RuntimeError(f"{done} of {nodes} nodes succeeded, {left} still waiting")
    worker = (worker1 - worker0) / nodes
    server = 0.0 if server0 is None or server1 is None else (server1 - server0) / nodes
    return Drained(float((last - first).total_seconds()) / nodes, worker + server, worker, server)


def _mean(before: Drained, after: Drained) -> Drained:
    """The baseline of a run: its two plain drains, averaged field by field."""
    return Drained(
        *(
            (getattr(before, f.name) + getattr(after, f.name)) / 2
            for f in dataclasses.fields(Drained)
        )
    )


def _plain(jobs: int) -> Callable[[jobrun.Client], int]:
    def enqueue(client: jobrun.Client) -> int:
        client.store.enqueue_batch([_job() for _ in range(jobs)])
        return jobs

    return enqueue


def _graphs(flows: list[jobrun.Workflow]) -> Callable[[jobrun.Client], int]:
    def enqueue(client: jobrun.Client) -> int:
        return sum(len(client.enqueue_workflow(flow)) for flow in flows)

    return enqueue


def _fanin_pickup(ctx: Context, fanins: int, rate: float, concurrency: int) -> list[float]:

    _reset(ctx)
    client = jobrun.Client(ctx.store)
    for _ in range(20):  # warm the enqueuer's connection (nobody listens to "warmup")
        ctx.store.enqueue(NewJob(type=NOOP, queue="warmup"))
    with measure.workers(ctx, QUEUE, concurrency, 1) as w:
        w.wait_ready()
        time.sleep(1.0)  # idle: the claimer waits for a wake-up
        start = time.perf_counter()
        for i in range(fanins):
            pause = start + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            flow = jobrun.Workflow(f"fan-in {i}")
            parents = flow.group([_job(), _job()])
            flow.add(_job(), after=parents, name="fan-in")
            client.enqueue_workflow(flow)
        deadline = time.monotonic() + 60
        while ctx.db.execute(
            "SELECT count(*) FROM jobrun.jobs WHERE queue = %s AND state <> 'succeeded'", [QUEUE]
        )[0][0]:
            w.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("the fan-ins did not all run within 60 s")
            time.sleep(0.05)
    return [float(r[0]) for r in ctx.db.execute(FANIN_LATENCY, [QUEUE])]


def workflows(ctx: Context) -> list[Figure]:

    s = ctx.sizes
    c = s.wf_concurrency
    plain, fan, chains, ratio_fan, ratio_chains = [], [], [], [], []
    wall_fan, wall_chains = [], []
    p50s, p95s, p99s = [], [], []
    phases: list[list[float]] = []
    links: list[list[float]] = []
    split: list[dict[str, float]] = []
    bracket: list[list[float]] = []  # each run's two plain drains, µs per job
    for run in range(ctx.runs):
        before = _drain(ctx, _plain(s.wf_plain_jobs), c)
        per_fan = _drain(ctx, _graphs([fanout(s.wf_fanout)]), c)
        phases.append([round(float(x), 4) for x in ctx.db.execute(FANOUT_PHASES)[0]])
        flows = [chain(n, s.wf_chain_length) for n in range(s.wf_chains)]
        per_chain = _drain(ctx, _graphs(flows), c)
        links.append([round(float(x) * 1000, 2) for x in ctx.db.execute(CHAIN_LINKS)[0]])
        after = _drain(ctx, _plain(s.wf_plain_jobs), c)
        base = _mean(before, after)
        bracket.append([round(before.cpu * 1e6, 1), round(after.cpu * 1e6, 1)])
        latencies = _fanin_pickup(ctx, s.wf_fanins, s.wf_fanin_rate, c)
        plain.append(base.cpu * 1e6)
        fan.append(per_fan.cpu * 1e6)
        chains.append(per_chain.cpu * 1e6)
        ratio_fan.append(per_fan.cpu / base.cpu)
        ratio_chains.append(per_chain.cpu / base.cpu)
        wall_fan.append(per_fan.wall / base.wall)
        wall_chains.append(per_chain.wall / base.wall)
        split.append(
            {
                f"{name}_{part}_us": round(getattr(d, f"cpu_{part}") * 1e6, 1)
                for name, d in (("plain", base), ("fanout", per_fan), ("chains", per_chain))
                for part in ("worker", "server")
            }
        )
        p50s.append(percentile(latencies, 50))
        p95s.append(percentile(latencies, 95))
        p99s.append(percentile(latencies, 99))
        ctx.say(
            f"workflows run {run + 1}: CPU per node (worker + server): plain {plain[-1]:.0f} µs"
            f" ({bracket[-1][0]:.0f} before the graphs, {bracket[-1][1]:.0f} after);"
            f" fan-out {fan[-1]:.0f} µs ({ratio_fan[-1]:.2f}x; wall {wall_fan[-1]:.2f}x; root,"
            f" release, children, fan-in start, fan-in: {', '.join(f'{x:.3f}' for x in phases[-1])}"
            f" s); chains {chains[-1]:.0f} µs ({ratio_chains[-1]:.2f}x; wall"
            f" {wall_chains[-1]:.2f}x; link p50: release to start {links[-1][0]:.1f} ms, start to"
            f" finished {links[-1][1]:.1f} ms); fan-in pickup p50 {p50s[-1]:.1f} ms,"
            f" p95 {p95s[-1]:.1f} ms ({len(latencies)} fan-ins)"
        )
    common: dict[str, Any] = {
        "concurrency": c,
        "processes": 1,
        "handler": NOOP,
        "cost": "CPU seconds per node, the worker's and the server's (from /proc)",
        "cpu_us": split,
    }
    plain_p = {**common, "jobs": s.wf_plain_jobs, "before_after_us": bracket}
    fan_p = {
        **common,
        "children": s.wf_fanout,
        "nodes": s.wf_fanout + 2,
        "phases_s": {
            "what": "root run, release to first child start, children drain,"
            " last child to fan-in start, fan-in run (one list per run)",
            "runs": phases,
        },
    }
    chain_p = {
        **common,
        "chains": s.wf_chains,
        "length": s.wf_chain_length,
        "nodes": s.wf_chains * s.wf_chain_length,
        "side_by_side": True,
        "link_ms": {
            "what": "medians: parent finished_at to child started_at, child started_at"
            " to its finished_at (one pair per run)",
            "runs": links,
        },
    }
    pick_p = {
        **common,
        "fan_ins": s.wf_fanins,
        "parents": 2,
        "rate_per_s": s.wf_fanin_rate,
        "from": "the later parent's finished_at (its releasing transaction)",
        "to": "the fan-in's started_at (its attempt's start), database clock",
    }
    ratio = at_most(TARGET_RATIO, "x")
    return [
        Figure("workflows.plain.cpu_per_job", "us", plain, plain_p),
        Figure("workflows.fanout.cpu_per_node", "us", fan, fan_p),
        Figure("workflows.fanout.ratio", "x", ratio_fan, fan_p, target=ratio),
        Figure("workflows.fanout.wall_ratio", "x", wall_fan, fan_p),
        Figure("workflows.chains.cpu_per_node", "us", chains, chain_p),
        Figure("workflows.chains.ratio", "x", ratio_chains, chain_p, target=ratio),
        Figure("workflows.chains.wall_ratio", "x", wall_chains, chain_p),
        Figure(
            "workflows.fanin_pickup.p50",
            "ms",
            p50s,
            pick_p,
            target=at_most(TARGET_PICKUP_MS, "ms"),
        ),
        Figure("workflows.fanin_pickup.p95", "ms", p95s, pick_p),
        Figure("workflows.fanin_pickup.p99", "ms", p99s, pick_p),
    ]
