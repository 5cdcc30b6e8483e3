-- Fixture schema for the sqlc-gen-psycopg tests: every type the plugin maps,
-- two enums (one with a label that is not a Python identifier), a table in
-- another schema (0003), and a jobs table shaped like jobrun's. Everything
-- lives in the schema jobrun, the plugin option schema: the queries name it,
-- and the generated Queries class runs them in another schema on demand
-- (tests/postgres/test_sqlc_fixture_roundtrip.py loads this DDL a second time
-- with the schema's name replaced).

CREATE SCHEMA jobrun;

CREATE TYPE jobrun.job_state AS ENUM ('queued', 'leased', 'succeeded', 'dead', 'cancelled');
CREATE TYPE jobrun.mood AS ENUM ('happy', 'sad', 'so-so');

CREATE TABLE jobrun.jobs (
    id          uuid        PRIMARY KEY,
    queue       text        NOT NULL,
    payload     jsonb       NOT NULL,
    priority    integer     NOT NULL DEFAULT 0,
    state       jobrun.job_state NOT NULL DEFAULT 'queued',
    run_at      timestamptz NOT NULL DEFAULT now(),
    lease_owner text,
    detail      jsonb
);

CREATE TABLE jobrun.job_events (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id uuid        NOT NULL,
    kind   text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT now(),
    detail jsonb
);
