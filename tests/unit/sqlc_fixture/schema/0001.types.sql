-- Fixture schema for the sqlc-gen-psycopg tests: every type the plugin maps,
-- two enums (one with a label that is not a Python identifier), a table in a
-- non-default schema, and a jobs table shaped like jobrun's.

CREATE TYPE job_state AS ENUM ('queued', 'leased', 'succeeded', 'dead', 'cancelled');
CREATE TYPE mood AS ENUM ('happy', 'sad', 'so-so');

CREATE TABLE jobs (
    id          uuid        PRIMARY KEY,
    queue       text        NOT NULL,
    payload     jsonb       NOT NULL,
    priority    integer     NOT NULL DEFAULT 0,
    state       job_state   NOT NULL DEFAULT 'queued',
    run_at      timestamptz NOT NULL DEFAULT now(),
    lease_owner text,
    detail      jsonb
);

CREATE TABLE job_events (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id uuid        NOT NULL,
    kind   text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT now(),
    detail jsonb
);
