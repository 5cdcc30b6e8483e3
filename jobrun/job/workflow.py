"""Dependencies and workflows: the graph, its checks, and what a child reads of its parents.

A job may wait for other jobs, its *parents*: it is stored ``waiting`` (not
claimable, in no claim index) with a count of the parents not finished, and
the database queues it in the transaction of the last of them finishing
(migration ``0016.workflows``). What a parent's failure (``dead`` or
``cancelled``) does is the child's :class:`OnParentFailure`.

A *workflow* is a graph of new jobs enqueued together, in one transaction,
under one id. :func:`plan` checks it before anything is written: node names
unique, every edge to a node of the graph or to a job id, no edge from a
node to itself, no cycle (named in the error), and returns the nodes parents
first, the order in which they are inserted.

What a child reads of its parents (:class:`ParentResults`) is loaded with its
claim, in the claim's own statement, and reaches the handler on its job
(``Job.parent_results``; ``JobContext.parent_results()``).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import json
import uuid
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, overload

from jobrun.job.errors import ValidationError
from jobrun.job.model import Job, JSONValue, NewJob, State

MAX_NODES = 100_000
"""Nodes of one workflow (one transaction)."""
MAX_PARENTS = 100_000
"""Parents of one job (a fan-in of a large fan-out)."""
MAX_NAME_CHARS = 255

R_co = TypeVar("R_co", covariant=True)
T = TypeVar("T")


class OnParentFailure(enum.StrEnum):
    """What a parent ending ``dead`` or ``cancelled`` does to a job waiting for it."""

    CANCEL = "cancel"
    """The child ends ``cancelled``, its ``last_error`` naming the parent (the
    default); its own children follow the same way, by their own policy."""
    RUN = "run"
    """The parent counts as finished: the child runs when the others have, and
    sees the failure in :meth:`ParentResults.failed`."""


def on_parent_failure(value: object) -> OnParentFailure:
    """``value`` as a policy (its enum or its text), or ValidationError."""
    if isinstance(value, OnParentFailure):
        return value
    try:
        return OnParentFailure(str(value)) if isinstance(value, str) else OnParentFailure("")
    except ValueError:
        raise ValidationError(
            "on_parent_failure", f"must be 'cancel' or 'run', not {value!r}"
        ) from None


def node_name(value: object, field: str = "name") -> str:
    """A node's name: a non-empty str of at most 255 characters."""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise ValidationError(field, f"must be a str of 1 to {MAX_NAME_CHARS} characters")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters")
    return str(value)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One job of a workflow: the job, its name, and what it waits for.

    ``after`` names nodes of the same workflow; ``parents`` are ids of jobs
    already stored (of any queue or workflow).
    """

    name: str
    job: NewJob
    after: tuple[str, ...] = ()
    parents: tuple[uuid.UUID, ...] = ()
    on_parent_failure: OnParentFailure = OnParentFailure.CANCEL

    @property
    def waits(self) -> bool:
        """Whether it has parents at all (a root has none)."""
        return bool(self.after or self.parents)


def plan(nodes: Sequence[Node]) -> list[Node]:
    """The nodes, checked, parents before children (see the module docstring).

    Every problem is a ValidationError naming the node; nothing is written
    by anyone before this returns.
    """
    if not nodes:
        raise ValidationError("workflow", "has no jobs")
    if len(nodes) > MAX_NODES:
        raise ValidationError("workflow", f"at most {MAX_NODES} jobs in one workflow")
    by_name: dict[str, Node] = {}
    ids: set[uuid.UUID] = set()
    for node in nodes:
        if node.name in by_name:
            raise ValidationError("workflow", f"two nodes are named {node.name!r}")
        by_name[node.name] = node
        if node.job.id in ids:
            raise ValidationError("workflow", f"node {node.name!r}: its job id is another node's")
        ids.add(node.job.id)
        if node.job.idempotency_key is not None:
            raise ValidationError(
                "idempotency_key",
                f"node {node.name!r}: a workflow's jobs take no idempotency key "
                "(the workflow's ids make a retried enqueue a replay)",
            )
    for node in nodes:
        if len(node.after) + len(node.parents) > MAX_PARENTS:
            raise ValidationError("after", f"node {node.name!r}: at most {MAX_PARENTS} parents")
        for parent in node.after:
            if parent == node.name:
                raise ValidationError("after", f"node {node.name!r} cannot wait for itself")
            if parent not in by_name:
                raise ValidationError(
                    "after", f"node {node.name!r} waits for {parent!r}, which is no node"
                )
        for parent_id in node.parents:
            if parent_id == node.job.id:
                raise ValidationError("after", f"node {node.name!r} cannot wait for itself")
            if parent_id in ids:
                raise ValidationError(
                    "after", f"node {node.name!r}: give a node of the workflow by its name"
                )
        if len(set(node.after)) != len(node.after) or len(set(node.parents)) != len(node.parents):
            raise ValidationError("after", f"node {node.name!r} names a parent twice")
    return _topological(nodes, by_name)


def _topological(nodes: Sequence[Node], by_name: Mapping[str, Node]) -> list[Node]:
    """Kahn's order, breadth first from the roots in the order given; a cycle is named."""
    waiting = {node.name: len(node.after) for node in nodes}
    children: dict[str, list[str]] = {node.name: [] for node in nodes}
    for node in nodes:
        for parent in node.after:
            children[parent].append(node.name)
    ready = collections.deque(node.name for node in nodes if not node.after)
    order: list[Node] = []
    while ready:
        name = ready.popleft()
        order.append(by_name[name])
        for child in children[name]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if len(order) < len(nodes):
        raise ValidationError("workflow", f"has a cycle: {' -> '.join(_a_cycle(by_name, waiting))}")
    return order


def _a_cycle(by_name: Mapping[str, Node], waiting: Mapping[str, int]) -> list[str]:
    """One cycle among the nodes Kahn's order could not place, for the error."""
    left = {name for name, count in waiting.items() if count > 0}
    name = min(left)
    seen: dict[str, int] = {}
    path: list[str] = []
    while name not in seen:
        seen[name] = len(path)
        path.append(name)
        name = next(p for p in sorted(by_name[name].after) if p in left)
    cycle = path[seen[name] :]
    return [*reversed(cycle), cycle[-1]]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ParentResult:
    """A parent's outcome as its child's claim read it."""

    id: uuid.UUID
    type: str
    node: str | None
    """Its node's name in its workflow (None: a job enqueued alone)."""
    state: State
    result: JSONValue = None
    """What its handler returned (None unless it succeeded)."""
    error: str | None = None
    """Its last error (a failure's text), if any."""

    @property
    def ok(self) -> bool:
        """Whether it succeeded (a child runs after a failure only with policy 'run')."""
        return self.state is State.SUCCEEDED


class _Returns(Protocol[R_co]):
    """A typed task (``jobrun.Task[P, R]``): its job type, and what it returns."""

    @property
    def type(self) -> str: ...

    def __call__(self, *args: Any, **kwargs: Any) -> R_co: ...


class ParentResults(Mapping[str, ParentResult]):
    """A child's parents, by node name (or, for a parent outside any workflow,
    its id's text); ``results[uuid]`` finds one by id too.

    In the order of their ids (the order they were enqueued in).
    """

    __slots__ = ("_by_key", "_list", "_text")

    def __init__(self, parents: Sequence[ParentResult]) -> None:
        self._text: str | None = None
        self._keep(tuple(parents))

    @classmethod
    def decoded_later(cls, text: str) -> ParentResults:
        """The parents from their stored form, the JSON array a claim reads, decoded
        when first read: most handlers never look at them, and decoding every
        claimed child's parents was most of what a fan-out's child cost the
        worker more than a plain job (30 µs of CPU over a plain job's before,
        7 after, in ``make bench``'s workflows rows)."""
        parents = cls.__new__(cls)
        parents._text = text
        return parents

    def _keep(self, parents: tuple[ParentResult, ...]) -> None:
        self._by_key = {(p.node if p.node is not None else str(p.id)): p for p in parents}
        self._list = parents  # last: a reader on another thread takes it as the sign

    @property
    def _parents(self) -> tuple[ParentResult, ...]:
        try:
            return self._list
        except AttributeError:  # decoded_later, not read yet (two first readers: both decode)
            assert self._text is not None
            self._keep(tuple(parent_result(item) for item in json.loads(self._text)))
            return self._list

    @property
    def _keys(self) -> dict[str, ParentResult]:
        self._parents  # noqa: B018 (decodes them, if not done yet)
        return self._by_key

    def __getitem__(self, key: str | uuid.UUID) -> ParentResult:
        if isinstance(key, uuid.UUID):
            for parent in self._parents:
                if parent.id == key:
                    return parent
            raise KeyError(key)
        return self._keys[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._parents)

    def __repr__(self) -> str:
        return f"ParentResults({list(self._parents)!r})"

    def result(self, key: str | uuid.UUID) -> JSONValue:
        """The result of one parent (KeyError when there is none by that key)."""
        return self[key].result

    @overload
    def of(self, task: str) -> list[Any]: ...
    @overload
    def of(self, task: _Returns[Awaitable[T]]) -> list[T]: ...
    @overload
    def of(self, task: _Returns[T]) -> list[T]: ...
    def of(self, task: _Returns[Any] | str) -> list[Any]:
        """The results of the parents of ``task``'s type (a Task, or a job type), in
        order, those that succeeded: a fan-in's values, typed by the task's return
        type (an ``async def`` task's too; as JSON brought them back: a tuple
        returned is a list here)."""
        kind = task if isinstance(task, str) else task.type
        return [p.result for p in self._parents if p.ok and p.type == kind]

    @property
    def failed(self) -> list[ParentResult]:
        """The parents that ended dead or cancelled (empty unless policy 'run')."""
        return [p for p in self._parents if not p.ok]

    @property
    def all(self) -> tuple[ParentResult, ...]:
        return self._parents


NO_PARENTS = ParentResults(())
"""What a job without parents reads."""


def parent_result(item: Mapping[str, Any]) -> ParentResult:
    """One parent from its stored form (an element of the claim's aggregate)."""
    return ParentResult(
        id=uuid.UUID(item["id"]),
        node=item.get("node"),
        state=State(item["state"]),
        result=item.get("result"),
        error=item.get("error"),
        type=item["type"],
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EnqueuedWorkflow:
    """A graph as it was enqueued: its id (None for a job enqueued alone with
    parents) and its jobs by node name, in the order they were inserted."""

    id: uuid.UUID | None
    name: str | None
    jobs: Mapping[str, Job]

    def __getitem__(self, node: str) -> Job:
        return self.jobs[node]

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs.values())

    def __len__(self) -> int:
        return len(self.jobs)


class WorkflowState(enum.StrEnum):
    """A workflow's state, derived from its jobs' (a workflow has no state column)."""

    RUNNING = "running"
    """Some job of it has not finished (waiting, queued or leased)."""
    SUCCEEDED = "succeeded"
    """Every job succeeded."""
    FAILED = "failed"
    """Every job finished, at least one ``dead``."""
    CANCELLED = "cancelled"
    """Every job finished, none ``dead``, at least one ``cancelled``."""

    @classmethod
    def of(cls, counts: Mapping[State, int]) -> WorkflowState:
        """The state of a workflow whose jobs are ``counts`` (jobs by state).

        One rule for the CLI, the dashboard and the metrics: a workflow is
        running while any job can still run, and once none can, the worst
        outcome names it (dead before cancelled before succeeded)."""
        if any(n > 0 for state, n in counts.items() if not state.terminal):
            return cls.RUNNING
        if counts.get(State.DEAD, 0) > 0:
            return cls.FAILED
        if counts.get(State.CANCELLED, 0) > 0:
            return cls.CANCELLED
        return cls.SUCCEEDED


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowSummary:
    """One workflow at a glance: what ``jobrun workflows list`` and the
    dashboard's list show. ``finished_at`` is its last job's finish, None
    while it runs; its time to completion is ``finished_at - created_at``."""

    id: uuid.UUID
    name: str
    created_at: datetime.datetime
    finished_at: datetime.datetime | None
    jobs: Mapping[State, int]

    @property
    def state(self) -> WorkflowState:
        return WorkflowState.of(self.jobs)

    @property
    def total(self) -> int:
        return sum(self.jobs.values())


def workflow_state(value: object) -> WorkflowState:
    """``value`` as a workflow's state (its enum or its text), or ValidationError."""
    if isinstance(value, WorkflowState):
        return value
    if isinstance(value, str):
        try:
            return WorkflowState(value)
        except ValueError:
            pass
    known = ", ".join(s.value for s in WorkflowState)
    raise ValidationError("state", f"must be one of {known}, not {value!r}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowNode:
    """One job of a workflow as ``jobrun workflows get`` shows it."""

    id: uuid.UUID
    node: str
    type: str
    queue: str
    state: State
    attempts: int
    last_error: str | None
    finished_at: datetime.datetime | None
    parents: tuple[uuid.UUID, ...] = ()
    """Its parents inside the workflow, by job id (the edges' other end)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowGraph:
    """A workflow with its jobs and the edges between them.

    ``nodes`` are parents before children (Kahn's order, ties broken by job
    id: the order they were enqueued in), so a reader can print them top
    down; ``edges`` are (parent id, child id) pairs inside the workflow (a
    parent outside it, a job enqueued on its own, is not drawn). A job
    purged already is not there: a graph read after a partial purge has
    fewer nodes than the workflow had.
    """

    summary: WorkflowSummary
    nodes: tuple[WorkflowNode, ...]
    edges: tuple[tuple[uuid.UUID, uuid.UUID], ...]

    @property
    def id(self) -> uuid.UUID:
        return self.summary.id

    @property
    def state(self) -> WorkflowState:
        return self.summary.state

    def __getitem__(self, node: str) -> WorkflowNode:
        for n in self.nodes:
            if n.node == node:
                return n
        raise KeyError(node)


def graph(
    summary: WorkflowSummary,
    nodes: Sequence[WorkflowNode],
    edges: Sequence[tuple[uuid.UUID, uuid.UUID]],
) -> WorkflowGraph:
    """A :class:`WorkflowGraph` from its rows: parents set on each node, nodes parents first."""
    by_id = {n.id: n for n in sorted(nodes, key=lambda n: n.id)}
    inside = sorted((p, c) for p, c in edges if p in by_id and c in by_id)
    parents: dict[uuid.UUID, list[uuid.UUID]] = {i: [] for i in by_id}
    children: dict[uuid.UUID, list[uuid.UUID]] = {i: [] for i in by_id}
    for parent, child in inside:
        parents[child].append(parent)
        children[parent].append(child)
    waiting = {i: len(ps) for i, ps in parents.items()}
    ready = collections.deque(i for i in by_id if waiting[i] == 0)
    order: list[uuid.UUID] = []
    while ready:
        current = ready.popleft()
        order.append(current)
        for child in children[current]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    order.extend(i for i in by_id if waiting[i] > 0)  # never: a stored graph has no cycle
    return WorkflowGraph(
        summary=summary,
        nodes=tuple(dataclasses.replace(by_id[i], parents=tuple(parents[i])) for i in order),
        edges=tuple(inside),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowCancelled:
    """What cancelling a workflow did, in counts of its jobs."""

    id: uuid.UUID
    cancelled: int
    """Waiting or queued: cancelled now."""
    cancel_requested: int
    """Running: cancel requested, their workers stop them (as ``cancel`` of a running job)."""
    finished: int
    """Already finished (or already asked to stop): left as they were."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowRetried:
    """What retrying a workflow did, in counts of its jobs."""

    id: uuid.UUID
    queued: int
    """Dead or cancelled jobs retried and queued now (their parents all done)."""
    waiting: int
    """Dead or cancelled jobs retried that wait for a parent retried too (or still running)."""
    kept: int
    """Jobs not retried: succeeded, or not finished."""

    @property
    def retried(self) -> int:
        return self.queued + self.waiting


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetryPlan:
    """The writes of a workflow's retry, decided from its locked rows and edges.

    ``retried`` are the jobs to run again (dead or cancelled) with the count
    of parents each waits for again; ``reopened`` the edges (child, parent)
    whose parent is retried, counted once more; ``rewait`` the jobs still
    waiting that count a retried parent again, with how many.
    """

    retried: Mapping[uuid.UUID, int]
    reopened: tuple[tuple[uuid.UUID, uuid.UUID], ...]
    rewait: Mapping[uuid.UUID, int]


def retry_plan(
    states: Mapping[uuid.UUID, State],
    edges: Sequence[tuple[uuid.UUID, uuid.UUID, bool]],
) -> RetryPlan:
    """Which jobs of a workflow a retry runs again, and how their edges are put back.

    ``states`` are the workflow's jobs as locked; ``edges`` every
    (child, parent, done) whose child is one of them. A job ``dead`` or
    ``cancelled`` is retried; a succeeded one never is (nor a job not
    finished). An edge from a retried parent is reopened (not done) for a
    child retried too or still waiting: that child counts the parent again,
    and the trigger releases it when the parent's new run ends. A retried
    job waits for every edge not done after that (a retried parent, or a
    parent still running); with none it is queued at once. An edge to a
    parent that succeeded, or to one outside the workflow that ended, stays
    done: it is not waited for again.
    """
    retried = {i for i, s in states.items() if s in (State.DEAD, State.CANCELLED)}
    reopened: list[tuple[uuid.UUID, uuid.UUID]] = []
    pending = dict.fromkeys(retried, 0)
    rewait: dict[uuid.UUID, int] = {}
    for child, parent, done in sorted(edges):
        reopen = done and parent in retried
        if child in retried:
            if reopen:
                reopened.append((child, parent))
            if reopen or not done:
                pending[child] += 1
        elif reopen and states.get(child) is State.WAITING:
            reopened.append((child, parent))
            rewait[child] = rewait.get(child, 0) + 1
    return RetryPlan(retried=pending, reopened=tuple(reopened), rewait=rewait)
