"""Workflows: jobs that wait for other jobs, built in Python, enqueued in one transaction.

::

    wf = jobrun.Workflow("order 42")
    order = wf.add(load_order.new_job(42))                         # a root
    lines = wf.group([price_line.new_job(i) for i in (1, 2, 3)], after=[order])  # fan-out
    total = wf.add(total_order.new_job(42), after=lines)            # fan-in
    wf.chain(total, send_invoice.new_job(42), archive.new_job(42))  # B after A after ...
    run = client.enqueue_workflow(wf)        # one transaction; run["total_order"] is a Job

A child runs when all its parents have finished, released by the database
in the transaction of the last of them finishing (migration
``0016.workflows``); it reads their outcomes with
``ctx.parent_results()`` (``.of(price_line)``: the results of its
``price_line`` parents, typed by that task's return type). A parent that
fails (dead, cancelled) cancels the child, naming itself in the child's
``last_error``, unless the child was added with ``on_parent_failure="run"``.

The names Celery users know map onto one method each: a *chain* is
:meth:`Workflow.chain`, a *group* :meth:`Workflow.group`, a *chord* a group
and one :meth:`Workflow.add` ``after=`` it. Unlike Celery's canvas, the graph
is stored whole, at once: a crash between two steps loses nothing and runs
nothing twice.

Every check (a cycle, a self-edge, a node named twice, a parent that is no
node, a bad policy) is a ``ValidationError`` raised before anything is
written; a parent given by id that does not exist is one too, raised by the
enqueue before its transaction writes anything that would stay.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

from jobrun.job.errors import ValidationError
from jobrun.job.model import Job, NewJob
from jobrun.job.workflow import (
    EnqueuedWorkflow,
    Node,
    OnParentFailure,
    node_name,
    on_parent_failure,
    plan,
)

__all__ = ["After", "NodeRef", "Workflow", "parent_ids"]


class NodeRef:
    """A node of a :class:`Workflow`, to name in another node's ``after``."""

    __slots__ = ("id", "name", "type", "workflow")

    def __init__(self, name: str, job: NewJob, workflow: uuid.UUID) -> None:
        self.name = name
        self.workflow = workflow
        """The id of the workflow it is a node of."""
        self.id: uuid.UUID = job.id
        """The id its job will have once enqueued."""
        self.type = job.type

    def __repr__(self) -> str:
        return f"NodeRef({self.name!r}, type={self.type!r})"


After: TypeAlias = "NodeRef | str | uuid.UUID | Job"
"""A parent: a node of the same workflow (its NodeRef or its name), or a job
already enqueued (its id, or the Job)."""


class Workflow:
    """A graph of new jobs under one name (see the module docstring)."""

    def __init__(self, name: str, *, id: uuid.UUID | None = None) -> None:
        self.name = node_name(name, "name")
        if id is not None and not isinstance(id, uuid.UUID):
            raise ValidationError("id", "must be a uuid.UUID")
        self.id = id or uuid.uuid4()
        """The workflow's id (every job of it carries it as ``workflow_id``)."""
        self._nodes: list[Node] = []
        self._names: set[str] = set()
        self._per_type: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, {len(self._nodes)} jobs)"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    def add(
        self,
        job: NewJob,
        *,
        after: Iterable[After] | After = (),
        name: str | None = None,
        on_parent_failure: OnParentFailure | str = OnParentFailure.CANCEL,
    ) -> NodeRef:
        """Add ``job``, to run once every job of ``after`` has finished.

        ``name`` is the key its children read its result under (default: its
        type, then ``type.1``, ``type.2``... for more jobs of that type).
        """
        if not isinstance(job, NewJob):
            raise ValidationError(
                "job", f"must be a jobrun.NewJob (task.new_job(...)), not {type(job).__name__}"
            )
        policy = _policy(on_parent_failure)
        node = name if name is not None else self._default_name(job.type)
        node = node_name(node, "name")
        if node in self._names:
            raise ValidationError("name", f"two nodes are named {node!r}")
        inside: list[str] = []
        outside: list[uuid.UUID] = []
        for parent in _parents(after):
            if isinstance(parent, NodeRef):
                if parent.workflow != self.id:
                    raise ValidationError(
                        "after",
                        f"{parent.name!r} is a node of another workflow: give its job id "
                        "(NodeRef.id) once that workflow is enqueued",
                    )
                inside.append(parent.name)
            elif isinstance(parent, str):
                inside.append(parent)
            elif isinstance(parent, Job):
                outside.append(parent.id)
            elif isinstance(parent, uuid.UUID):
                outside.append(parent)
            else:
                raise ValidationError(
                    "after",
                    f"a parent is a node (its NodeRef or name) or a job (its id or the Job), "
                    f"not {type(parent).__name__}",
                )
        self._nodes.append(
            Node(
                name=node,
                job=job,
                after=tuple(inside),
                parents=tuple(outside),
                on_parent_failure=policy,
            )
        )
        self._names.add(node)
        return NodeRef(node, job, self.id)

    def chain(
        self, *steps: NewJob | NodeRef, on_parent_failure: OnParentFailure | str = "cancel"
    ) -> list[NodeRef]:
        """Each step after the one before it (a NodeRef already added may start
        the chain); returns the nodes in order."""
        if not steps:
            raise ValidationError("chain", "has no steps")
        refs: list[NodeRef] = []
        for step in steps:
            if isinstance(step, NodeRef):
                if refs:
                    raise ValidationError("chain", "only the first step may be a node added before")
                refs.append(step)
                continue
            previous = refs[-1:]
            refs.append(self.add(step, after=previous, on_parent_failure=on_parent_failure))
        return refs

    def group(
        self,
        jobs: Iterable[NewJob],
        *,
        after: Iterable[After] | After = (),
        on_parent_failure: OnParentFailure | str = "cancel",
    ) -> list[NodeRef]:
        """Jobs that run side by side (a fan-out), each after ``after``; add a job
        ``after=`` the list returned for the fan-in."""
        parents: list[Any] = _parents(after)
        refs = [self.add(job, after=parents, on_parent_failure=on_parent_failure) for job in jobs]
        if not refs:
            raise ValidationError("group", "has no jobs")
        return refs

    def check(self) -> None:
        """Every check of the graph, without enqueueing (enqueue runs them too)."""
        plan(self._nodes)

    def _default_name(self, job_type: str) -> str:
        n = self._per_type.get(job_type, 0)
        while True:
            candidate = job_type if n == 0 else f"{job_type}.{n}"
            n += 1
            if candidate not in self._names:
                self._per_type[job_type] = n
                return candidate


def _policy(value: object) -> OnParentFailure:
    return on_parent_failure(value)


def _parents(after: object) -> list[Any]:
    if isinstance(after, NodeRef | str | uuid.UUID | Job):
        return [after]
    if not isinstance(after, Iterable):
        raise ValidationError("after", f"must be a parent or a list of them, not {after!r}")
    return list(after)


def parent_ids(after: Iterable[uuid.UUID | Job | str] | uuid.UUID | Job) -> tuple[uuid.UUID, ...]:
    """``after=`` of a job enqueued alone (``client.enqueue(..., after=[...])``): job
    ids, as UUIDs, their text, or the Jobs."""
    found: list[uuid.UUID] = []
    for value in _parents(after):
        if isinstance(value, Job):
            found.append(value.id)
        elif isinstance(value, uuid.UUID):
            found.append(value)
        else:
            try:
                found.append(uuid.UUID(str(value)))
            except ValueError:
                raise ValidationError("after", f"{value!r} is not a job id") from None
    if not found:
        raise ValidationError("after", "names no job")
    return tuple(found)


def single(job: NewJob, after: Sequence[uuid.UUID], policy: OnParentFailure | str) -> list[Node]:
    """The one-node graph of a job enqueued alone with parents."""
    return [
        Node(name=str(job.id), job=job, parents=tuple(after), on_parent_failure=_policy(policy))
    ]


def job_of(enqueued: EnqueuedWorkflow) -> Job:
    """The job of a one-node graph."""
    (job,) = enqueued.jobs.values()
    return job
