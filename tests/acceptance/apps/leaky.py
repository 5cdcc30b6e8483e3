"""Handlers that quote their own connection string, as careless application code does.

``JOBRUN_TEST_LEAKY_DSNS`` (a JSON list) holds the DSN forms to quote; the
payload's ``form`` picks one (the payload itself never holds a secret).
"""

from __future__ import annotations

import json
import os

from jobrun.job.model import Job
from jobrun.postgres import dsn
from jobrun.worker.context import JobContext
from jobrun.worker.registry import PermanentFailure, Registry

registry = Registry()


def _dsn(job: Job) -> str:
    forms: list[str] = json.loads(os.environ["JOBRUN_TEST_LEAKY_DSNS"])
    return forms[job.payload["form"]]


@registry.handler("leak.raise")
def leak_raise(ctx: JobContext, job: Job) -> None:
    """Logs its DSN, then fails with it in the message and in a chained cause."""
    url = _dsn(job)
    ctx.logger.warning("connecting to %s", url)
    try:
        raise ConnectionError(f"inner: could not reach {url}")
    except ConnectionError as exc:
        raise RuntimeError(f"cannot reach {url}") from exc


@registry.handler("leak.permanent")
def leak_permanent(ctx: JobContext, job: Job) -> None:
    raise PermanentFailure(f"gave up on {_dsn(job)}")


@registry.handler("leak.params")
def leak_params(ctx: JobContext, job: Job) -> None:
    """Fails with the parameters of its own DATABASE_URL, as a dict prints them."""
    raise RuntimeError(f"bad settings: {dsn.parse(os.environ['DATABASE_URL'])}")
