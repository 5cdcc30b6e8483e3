-- depends: 0003.finished_token

-- The schema's version, read by every entry point at start (worker,
-- scheduler, CLI, Client.connect) to fail fast with one clear line when the
-- schema is missing, older than the code, or newer. It is a row of the
-- schema itself, not of the migration tool's bookkeeping, so a team that
-- applies jobrun's DDL through its own tool (`jobrun migrate --sql`) has it
-- too. Every later migration ends by setting it to its own number.
CREATE TABLE jobrun.schema_version (
    version integer     NOT NULL,
    one_row boolean     PRIMARY KEY DEFAULT true CHECK (one_row),
    at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO jobrun.schema_version (version) VALUES (4);
