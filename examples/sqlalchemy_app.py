"""A SQLAlchemy 2.x application on jobrun: both halves of "exactly once".

- ``place_order`` adds an order and enqueues its invoice job on the same
  ``Session``: the job exists exactly when the session commits;
- the ``invoice.record`` handler returns a commit callable that writes the
  ledger row through a ``Session`` lent on Complete's connection
  (``session_for``): the row lands once, with the job's success.

Run it (``DATABASE_URL`` names your PostgreSQL; jobrun's schema migrated)::

    jobrun migrate
    jobrun worker --app sqlalchemy_app:registry &
    python sqlalchemy_app.py

tests/contrib/test_examples.py runs exactly that.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import jobrun
from jobrun.contrib.sqlalchemy import session_for

registry = jobrun.Registry()


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "example_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    cents: Mapped[int]


class LedgerEntry(Base):
    __tablename__ = "example_ledger"
    order_id: Mapped[int] = mapped_column(primary_key=True)  # one entry per order, ever
    cents: Mapped[int]


@registry.handler("invoice.record")
def record_invoice(ctx: jobrun.JobContext, job: jobrun.Job) -> jobrun.Done:
    order, cents = job.payload["order"], job.payload["cents"]

    def commit(conn: psycopg.Connection[Any]) -> None:  # inside Complete's transaction, once
        with session_for(conn) as session:
            session.add(LedgerEntry(order_id=order, cents=cents))

    return jobrun.Done(result={"invoiced": order}, commit=commit)


def place_order(session: Session, client: jobrun.Client, order_id: int, cents: int) -> jobrun.Job:
    """The order and its invoice job, in the session's one transaction."""
    session.add(Order(id=order_id, cents=cents))
    return client.enqueue(
        "invoice.record",
        {"order": order_id, "cents": cents},
        idempotency_key=f"invoice-{order_id}",
        conn=session,
    )


def make_engine() -> Engine:
    """The application's engine on ``DATABASE_URL`` (a URL or a key=value string).

    Usually ``create_engine("postgresql+psycopg://user:password@host/dbname")``:
    jobrun needs the psycopg 3 dialect.
    """
    url = os.environ["DATABASE_URL"]
    return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(url))


def main(say: Callable[[str], None] = print) -> None:
    engine = make_engine()
    Base.metadata.create_all(engine)
    with jobrun.Client.connect() as client:
        with Session(engine) as session:
            job = place_order(session, client, 7, 1999)
            session.commit()  # the order and its job together
        with Session(engine) as session:
            place_order(session, client, 8, 500)
            session.rollback()  # declined: neither the order nor its job
        done = client.wait(job.id, timeout=60)
        say(f"order 7: {done.state} {done.result}")
        with Session(engine) as session:
            orders = session.scalars(select(Order.id).order_by(Order.id)).all()
            ledger = session.execute(select(LedgerEntry.order_id, LedgerEntry.cents)).all()
        say(f"orders: {list(orders)}")
        say(f"ledger: {[tuple(row) for row in ledger]}")
    engine.dispose()


if __name__ == "__main__":
    main()
