-- depends: 0007.flow_control

-- The scheduler's leader as a lease row (issue 16), for processes that reach
-- the database only through a transaction pooler (PgBouncer in transaction
-- mode), where a session advisory lock would stay behind on whichever pooled
-- server connection ran it.
--
-- One row per election (`name`: the schema's leader, or a test's own). A
-- candidate takes the row when it is free or its lease has expired, by the
-- database clock, and bumps `term`: terms only grow, so a term names one
-- leadership exactly. The leader renews `expires_at` (again by the database
-- clock) while its (holder, term) still match and the lease has not run out.
-- Resigning expires the lease and keeps the row, so the next term is higher.
--
-- The fence: every leader action runs in a transaction whose first statement
-- locks this row FOR SHARE where holder, term and an unexpired lease match
-- (or the action is refused). A takeover is an UPDATE of the row, which waits
-- for every such transaction to end: all of term n's actions commit before
-- term n + 1 begins, and none of term n starts after it.
CREATE TABLE jobrun.leader (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    term       bigint      NOT NULL,
    elected_at timestamptz NOT NULL DEFAULT now(),
    renewed_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CONSTRAINT leader_term_positive CHECK (term >= 1),
    CONSTRAINT leader_name_length CHECK (length(name) BETWEEN 1 AND 255),
    CONSTRAINT leader_holder_length CHECK (length(holder) BETWEEN 1 AND 255)
);

UPDATE jobrun.schema_version SET version = 8, at = now();
