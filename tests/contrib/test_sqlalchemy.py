"""SQLAlchemy 2.x (psycopg 3 dialect): the job joins the session's transaction, and a
commit callable writes through a session lent on Complete's connection.

Against real PostgreSQL: an application table ``orders`` next to jobrun's schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

import jobrun
from jobrun.client import Client
from jobrun.contrib.sqlalchemy import psycopg_connection, session_for
from jobrun.job.model import Backoff, NewJob, State
from jobrun.postgres.store import Store
from jobrun.worker import Registry, Worker
from tests.contrib.conftest import job_types
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    cents: Mapped[int]


class Ledger(Base):
    __tablename__ = "ledger"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    order_id: Mapped[int]
    cents: Mapped[int]


@pytest.fixture
def engine(dsn: str, conn: psycopg.Connection[Any]) -> Iterator[sa.Engine]:
    """The application's engine on the test database, with its tables created."""
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, cents int NOT NULL)")
    conn.execute(
        "CREATE TABLE ledger (id serial PRIMARY KEY, order_id int NOT NULL UNIQUE, "
        "cents int NOT NULL)"
    )
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    try:
        yield engine
    finally:
        engine.dispose()


def orders(conn: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in conn.execute("SELECT id FROM orders ORDER BY id")]


# -- transactional enqueue -------------------------------------------------------------


def test_a_job_enqueued_on_a_session_exists_with_the_row_when_the_session_commits(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        session.add(Order(id=1, cents=100))
        session.flush()
        job = client.enqueue("invoice.record", {"order": 1}, conn=session)
        assert job_types(conn) == []  # not visible before the commit
        session.commit()
    assert orders(conn) == [1]
    assert job_types(conn) == ["invoice.record"]
    assert client.get(job.id).state is State.QUEUED


def test_a_job_enqueued_first_in_a_session_rolls_back_with_it(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    # Nothing has reached the server yet when the job is enqueued: the store
    # would commit it on its own if the session's transaction were not opened.
    with Session(engine) as session:
        client.enqueue("invoice.record", {"order": 1}, conn=session)
        session.add(Order(id=1, cents=100))
        session.flush()
        session.rollback()
    assert orders(conn) == []
    assert job_types(conn) == []


def test_a_job_enqueued_first_in_a_session_commits_with_it(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        client.enqueue("invoice.record", {"order": 1}, conn=session)
        session.add(Order(id=1, cents=100))
        session.commit()
    assert orders(conn) == [1]
    assert job_types(conn) == ["invoice.record"]


def test_a_session_that_rolls_back_keeps_neither_the_row_nor_the_job(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        session.add(Order(id=1, cents=100))
        session.flush()
        client.enqueue("invoice.record", {"order": 1}, conn=session)
        session.rollback()
    assert orders(conn) == []
    assert job_types(conn) == []


def test_a_session_closed_without_commit_keeps_no_job(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        client.enqueue("invoice.record", {"order": 1}, conn=session)
    assert job_types(conn) == []


def test_a_savepoint_rolled_back_removes_only_the_job_enqueued_inside_it(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        session.add(Order(id=1, cents=100))
        client.enqueue("kept", conn=session)
        nested = session.begin_nested()
        session.add(Order(id=2, cents=200))
        client.enqueue("dropped", conn=session)
        nested.rollback()
        client.enqueue("kept.after", conn=session)
        session.commit()
    assert orders(conn) == [1]
    assert job_types(conn) == ["kept", "kept.after"]


def test_an_enqueue_that_fails_leaves_the_sessions_transaction_usable(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        client.enqueue("t", {"n": 1}, idempotency_key="k", conn=session)
        with pytest.raises(jobrun.IdempotencyConflict):
            client.enqueue("t", {"n": 2}, idempotency_key="k", conn=session)
        session.add(Order(id=1, cents=100))
        session.commit()
    assert orders(conn) == [1]
    assert job_types(conn) == ["t"]


def test_an_idempotent_replay_on_a_session_returns_the_stored_job(
    engine: sa.Engine, client: Client
) -> None:
    with Session(engine) as session:
        first = client.enqueue("t", {"n": 1}, idempotency_key="k", conn=session)
        again = client.enqueue(
            "t", {"n": 1}, idempotency_key="k", id=jobrun.NewJob(type="t").id, conn=session
        )
        session.commit()
    assert again.id == first.id
    assert again.payload == {"n": 1}


def test_a_batch_enqueued_on_a_session_commits_or_rolls_back_with_it(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    batch = [NewJob(type="batch", payload={"n": n}) for n in range(3)]
    with Session(engine) as session:
        client.enqueue_batch(batch, conn=session)
        session.rollback()
    assert job_types(conn) == []
    with Session(engine) as session:
        result = client.enqueue_batch(
            [*batch, NewJob(type="keyed", idempotency_key="k")], conn=session
        )
        session.add(Order(id=1, cents=100))
        session.commit()
    assert result.inserted == 4
    assert job_types(conn) == ["batch", "batch", "batch", "keyed"]


def test_a_job_enqueued_on_a_core_connection_follows_its_transaction(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    with engine.connect() as connection:
        client.enqueue("rolled.back", conn=connection)
        connection.rollback()
        client.enqueue("committed", conn=connection)  # begins again, like any first use
        connection.execute(sa.text("INSERT INTO orders VALUES (1, 100)"))
        connection.commit()
        client.enqueue("never.committed", conn=connection)
    with engine.begin() as connection:
        client.enqueue("in.begin", conn=connection)
    assert orders(conn) == [1]
    assert job_types(conn) == ["committed", "in.begin"]


def test_a_scoped_session_enqueues_in_its_current_session(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    scoped = scoped_session(sessionmaker(engine))
    try:
        client.enqueue("scoped", conn=scoped)
        scoped.add(Order(id=1, cents=100))
        scoped.commit()
    finally:
        scoped.remove()
    assert job_types(conn) == ["scoped"]


def test_an_autocommit_engine_commits_the_job_at_once(
    engine: sa.Engine, client: Client, conn: psycopg.Connection[Any]
) -> None:
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    with auto.connect() as connection:
        client.enqueue("at.once", conn=connection)
        assert job_types(conn) == ["at.once"]


def test_a_session_on_another_driver_is_refused_by_name(client: Client) -> None:
    pg8000_like = sa.create_engine("sqlite://")
    with Session(pg8000_like) as session, pytest.raises(jobrun.ValidationError, match="psycopg"):
        client.enqueue("t", conn=session)
    pg8000_like.dispose()


def test_something_else_as_conn_is_refused_before_anything_is_written(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(jobrun.ValidationError, match="SQLAlchemy Session"):
        client.enqueue("t", conn=object())
    assert job_types(conn) == []


def test_the_psycopg_connection_under_a_session_is_the_dbapi_one(engine: sa.Engine) -> None:
    with Session(engine) as session:
        raw = psycopg_connection(session)
        assert raw is session.connection().connection.driver_connection


# -- a commit callable writing through a session ------------------------------------------


def record_invoice(
    ctx: jobrun.JobContext, job: jobrun.Job
) -> Callable[[psycopg.Connection[Any]], None]:
    def commit(conn: psycopg.Connection[Any]) -> None:
        with session_for(conn) as session:
            session.add(Ledger(order_id=job.payload["order"], cents=job.payload["cents"]))

    return commit


def test_a_commit_callable_writes_its_orm_row_exactly_once_and_the_job_succeeds(
    engine: sa.Engine,
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    registry.register("invoice.record", record_invoice)
    client = Client(store)
    payload = {"order": 7, "cents": 1999}
    first = client.enqueue("invoice.record", payload, idempotency_key="inv-7")
    # The same effect in another queue (a second submission): it shares the effect key.
    second = client.enqueue("invoice.record", payload, idempotency_key="inv-7", queue="again")
    make_worker(queues={"default": None, "again": None})
    for job in (first, second):
        assert wait_for(lambda job=job: client.get(job.id).state is State.SUCCEEDED)
    assert conn.execute("SELECT order_id, cents FROM ledger").fetchall() == [(7, 1999)]
    effects = sorted(
        e.detail["effect"]
        for job in (first, second)
        for e in client.events(job.id)
        if e.kind == "succeeded" and isinstance(e.detail, dict)
    )
    assert effects == ["already_applied", "applied"]


def test_a_commit_callable_whose_orm_write_fails_leaves_no_row_and_the_job_retries(
    engine: sa.Engine,
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute(
        "INSERT INTO ledger (order_id, cents) VALUES (8, 1)"
    )  # the unique order_id collides
    calls: list[int] = []

    def handler(
        ctx: jobrun.JobContext, job: jobrun.Job
    ) -> Callable[[psycopg.Connection[Any]], None]:
        calls.append(job.attempts)

        def commit(conn: psycopg.Connection[Any]) -> None:
            with session_for(conn) as session:
                session.add(Ledger(order_id=99, cents=5))  # flushed first: rolled back too
                session.flush()
                session.add(Ledger(order_id=8 if job.attempts == 1 else 80, cents=500))

        return commit

    registry.register("invoice.record", handler)
    client = Client(store)
    job = client.enqueue("invoice.record", backoff=NO_WAIT)
    make_worker()
    assert wait_for(lambda: client.get(job.id).state is State.SUCCEEDED)
    assert calls == [1, 2]
    assert sorted(conn.execute("SELECT order_id FROM ledger").fetchall()) == [(8,), (80,), (99,)]
    retrying = [e for e in client.events(job.id) if e.kind == "retrying"]
    assert len(retrying) == 1


def test_a_lent_session_cannot_end_the_transaction_it_joined(
    engine: sa.Engine, conn: psycopg.Connection[Any], dsn: str
) -> None:
    with psycopg.connect(dsn) as raw:
        raw.execute("SELECT 1")  # a transaction open, as a commit callable's is
        with session_for(raw) as session:
            session.add(Order(id=1, cents=100))
            session.commit()  # releases the session's savepoint only
            session.add(Order(id=2, cents=200))
            session.rollback()  # back to the session's savepoint only
        with pytest.raises(jobrun.CommitRefused), session_for(raw) as session:
            session.add(Order(id=3, cents=300))
            session.connection().commit()  # the lent transaction itself: refused
        assert raw.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert orders(raw) == [1]
        assert orders(conn) == []  # nothing committed: the transaction is still the lender's
        raw.rollback()
    assert orders(conn) == []


def test_a_lent_session_needs_an_open_transaction(dsn: str) -> None:
    with (
        psycopg.connect(dsn, autocommit=True) as raw,
        pytest.raises(jobrun.ValidationError, match="open transaction"),
        session_for(raw),
    ):
        pass


def test_a_lent_session_leaves_the_connection_open_and_as_it_was(
    engine: sa.Engine, dsn: str
) -> None:
    with psycopg.connect(dsn) as raw:
        raw.execute("SELECT 1")
        adapters = raw.adapters
        for n in range(3):
            with session_for(raw) as session:
                session.add(Order(id=n, cents=n))
        assert not raw.closed
        assert raw.adapters is adapters
        assert orders(raw) == [0, 1, 2]
        raw.commit()
