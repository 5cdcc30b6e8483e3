"""The PostgreSQL schema jobrun lives in: its name, and SQL written for it.

Every jobrun object (tables, the ``job_state`` type, the migration
bookkeeping) lives in one schema, ``jobrun`` unless the deployment picks
another (``JOBRUN_SCHEMA``). Migrations and queries are written with the
default name as an explicit qualifier (``jobrun.jobs``), so that they never
depend on a connection's ``search_path``: a caller's connection, with
whatever ``search_path`` (or a ``public.jobs`` table of its own), reaches
exactly jobrun's tables. Another name is written in place of every
``jobrun.`` qualifier before the SQL is sent: the generated query layer does
it for the queries (``Queries(schema=...)``), :func:`in_schema` for the
migrations, with the same lexer-aware rewrite (string literals, comments and
dollar quotes are left alone).
"""

from __future__ import annotations

import re

from jobrun.job.errors import ValidationError
from jobrun.postgres.sqlc._schema import rebind

DEFAULT_SCHEMA = "jobrun"
SCHEMA_VERSION = 25
"""The schema version this code needs: the number of the last migration, which
every migration from 0004 on writes into ``schema_version``."""
SCHEMA_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""A plain, unquoted, lower-case identifier that is not PostgreSQL's own (pg_*)."""

_SCHEMA_DDL = re.compile(r"\b(SCHEMA\s+(?:IF\s+NOT\s+EXISTS\s+)?)jobrun\b")


def schema_name(value: object, field: str = "schema") -> str:
    """``value`` as a schema name, or ValidationError naming ``field``."""
    if not isinstance(value, str) or not SCHEMA_PATTERN.fullmatch(value):
        raise ValidationError(
            field,
            f"{value!r} is not a schema name (1-63 characters of a-z 0-9 _, "
            "starting with a letter or _)",
        )
    if value.startswith("pg_") or value in ("information_schema", "public"):
        raise ValidationError(field, f"{value!r} is reserved; pick a schema of jobrun's own")
    return value


def in_schema(sql: str, schema: str) -> str:
    """``sql`` (written for the default schema) with ``schema`` in every qualifier."""
    if schema == DEFAULT_SCHEMA:
        return sql
    name = schema_name(schema)
    return _SCHEMA_DDL.sub(rf"\g<1>{name}", rebind(sql, name))
