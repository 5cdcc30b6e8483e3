"""The raw limits: what PostgreSQL allows a Python client on this machine, no queue library.

Run by the orchestrator in jobrun's ``.venv`` (psycopg 3, its defaults)::

    python -m bench.peers.raw insert_one|copy|ceiling --dsn URL --jobs N [--threads T]

insert_one  the floor for enqueue one: one connection (autocommit off), per
            call ``INSERT INTO raw_jobs (queue, type, payload) VALUES ...``
            + ``COMMIT``, after ``WARMUP_CALLS`` warm-up calls
copy        the floor for a batch: ``COPY raw_jobs (queue, type, payload)
            FROM STDIN (FORMAT BINARY)`` of N rows + ``COMMIT``; the row
            tuples are built before the clock starts, each payload's JSON is
            encoded as the row is written (every system encodes its payloads)
ceiling     the transaction ceiling of bench/measure.py's ``ceiling``: T
            threads, a connection each, per transaction ``UPDATE
            raw_ceiling_jobs SET state, attempts, updated_at WHERE id = $1``
            + ``INSERT INTO raw_ceiling_log`` + ``COMMIT``; N transactions,
            wall clock from a barrier's release to the last join

``raw_jobs`` is shaped like a small job row (an identity key, queue, type,
JSON payload, state, priority, attempts, run_at, created_at) with the one
index a queue cannot do without (a partial claim index on queued rows):
a floor, not a job system.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.peers import common

SCHEMA = """
CREATE TABLE raw_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    state text NOT NULL DEFAULT 'queued',
    priority integer NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX raw_jobs_claim ON raw_jobs (queue, priority, run_at) WHERE state = 'queued';
CREATE TABLE raw_ceiling_jobs (
    id bigint PRIMARY KEY,
    state text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE raw_ceiling_log (job_id bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
"""
"""The raw tables, created in raw's template database by the orchestrator."""

INSERT = "INSERT INTO raw_jobs (queue, type, payload) VALUES (%s, %s, %s)"
COPY = "COPY raw_jobs (queue, type, payload) FROM STDIN (FORMAT BINARY)"
CEILING_UPDATE = (
    "UPDATE raw_ceiling_jobs SET state = 'succeeded', attempts = attempts + 1,"
    " updated_at = now() WHERE id = %s"
)
CEILING_INSERT = "INSERT INTO raw_ceiling_log (job_id) VALUES (%s)"


def insert_one(args: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(args.dsn) as conn:
        for i in range(common.WARMUP_CALLS):
            conn.execute(INSERT, (common.WARMUP_QUEUE, "noop", Jsonb(common.payload(i))))
            conn.commit()
        started = time.perf_counter()
        for i in range(args.jobs):
            conn.execute(INSERT, (common.QUEUE, "noop", Jsonb(common.payload(i))))
            conn.commit()
        seconds = time.perf_counter() - started
    return {"jobs": args.jobs, "seconds": seconds, "statements": [INSERT, "COMMIT"]}


def copy(args: argparse.Namespace) -> dict[str, Any]:
    rows = [(common.QUEUE, "noop", common.payload(i)) for i in range(args.jobs)]
    with psycopg.connect(args.dsn) as conn:
        conn.execute("SELECT 1")
        conn.commit()
        started = time.perf_counter()
        with conn.cursor() as cur, cur.copy(COPY) as out:
            out.set_types(["text", "text", "jsonb"])
            for row in rows:
                out.write_row(row)
        conn.commit()
        seconds = time.perf_counter() - started
        inserted = conn.execute("SELECT count(*) FROM raw_jobs").fetchone()
    return {
        "jobs": args.jobs,
        "inserted": inserted[0] if inserted else 0,
        "seconds": seconds,
        "statements": [COPY, "COMMIT"],
    }


def ceiling(args: argparse.Namespace) -> dict[str, Any]:
    n, threads = args.jobs, args.threads
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO raw_ceiling_jobs (id, state)"
            " SELECT g, 'leased' FROM generate_series(1, %s) g",
            [n],
        )
        conn.execute("VACUUM ANALYZE raw_ceiling_jobs")
    conns = [psycopg.connect(args.dsn) for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work(k: int, conn: psycopg.Connection[Any]) -> None:
        try:
            barrier.wait()
            for i in range(k + 1, n + 1, threads):
                conn.execute(CEILING_UPDATE, [i])
                conn.execute(CEILING_INSERT, [i])
                conn.commit()
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(k, c), daemon=True) for k, c in enumerate(conns)]
    try:
        for t in pool:
            t.start()
        barrier.wait()
        started = time.perf_counter()
        for t in pool:
            t.join()
        seconds = time.perf_counter() - started
    finally:
        for c in conns:
            c.close()
    if errors:
        raise errors[0]
    return {
        "jobs": n,
        "threads": threads,
        "seconds": seconds,
        "statements": [CEILING_UPDATE, CEILING_INSERT, "COMMIT"],
    }


COMMANDS = {"insert_one": insert_one, "copy": copy, "ceiling": ceiling}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peers.raw")
    p.add_argument("command", choices=sorted(COMMANDS))
    p.add_argument("--dsn", required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--threads", type=int, default=8)
    args = p.parse_args(argv)
    print(common.RESULT_PREFIX + json.dumps(COMMANDS[args.command](args)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
