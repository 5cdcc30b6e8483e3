-- A schema of its own that the queries name as it is: Queries(schema=...)
-- rebinds the schema jobrun only.

CREATE SCHEMA audit;

CREATE TABLE audit.entries (
    id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    note text   NOT NULL
);
