"""Job and workflow ids as people type them: whole, or the start of one (a unique prefix).

The dashboard filters jobs by an id prefix; the command takes one wherever
it takes a job id (``get``, ``events``, ``cancel``, ``retry``, ``list
--before/--after``), through the same query (:meth:`DashboardReads.ids_with_prefix`),
and wherever it takes a workflow id (``workflows get|cancel|retry``,
``workflows list --before``), through a bounded scan of the workflows'
primary key (:meth:`DashboardReads.workflow_ids_with_prefix`).
A whole id is used as it is, without a lookup. A prefix that matches no job
is "not found" (exit 3); one that matches several is a validation error
(exit 7) that says how many, so the next try types more of it.

Tables show each job's shortest unique prefix instead of its 36
characters (:meth:`DashboardReads.short_ids`): what ``get`` takes back.
"""

from __future__ import annotations

import uuid

from jobrun.client import Client
from jobrun.job.errors import NotFound, ValidationError
from jobrun.postgres.web import MAX_PREFIX_COUNT, DashboardReads, normalize_id_prefix


def whole_or_prefix(text: str, flag: str, what: str = "job") -> uuid.UUID | str:
    """``text`` as a whole id, or as the hex prefix of one; a ValidationError
    (before any lookup) when it is neither."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        pass
    try:
        prefix = normalize_id_prefix(text)
    except ValidationError:
        prefix = None
    if prefix is None:
        raise ValidationError(
            flag, f"{text!r} is not a {what} id (a UUID, or its start: hex digits and dashes)"
        )
    return prefix


def workflow_id(client: Client, text: str, flag: str = "ID") -> uuid.UUID:
    """The workflow ``text`` names: a whole id, or the start of exactly one workflow's id."""
    prefix = whole_or_prefix(text, flag, "workflow")
    if isinstance(prefix, uuid.UUID):
        return prefix
    ids = DashboardReads(client.store).workflow_ids_with_prefix(prefix)
    if not ids:
        raise NotFound("workflow", f"with an id starting {text.strip()!r}")
    if len(ids) > 1:
        raise ValidationError(
            flag, f"{text.strip()!r} is the start of several workflow ids: give more of the id"
        )
    return ids[0]


def job_id(client: Client, text: str, flag: str = "ID") -> uuid.UUID:
    """The job ``text`` names: a whole id, or the start of exactly one job's id."""
    prefix = whole_or_prefix(text, flag)
    if isinstance(prefix, uuid.UUID):
        return prefix
    ids, count = DashboardReads(client.store).ids_with_prefix(prefix)
    if not ids:
        raise NotFound("job", f"with an id starting {text.strip()!r}")
    if count > 1:
        many = f"more than {MAX_PREFIX_COUNT}" if count > MAX_PREFIX_COUNT else str(count)
        raise ValidationError(
            flag, f"{text.strip()!r} is the start of {many} job ids: give more of the id"
        )
    return ids[0]
