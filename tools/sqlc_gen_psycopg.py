#!/usr/bin/env python3
"""sqlc-gen-psycopg: a sqlc process plugin that writes typed psycopg 3 code.

sqlc (``format: json``) runs this file with its GenerateRequest as protojson on
stdin and reads a GenerateResponse as JSON on stdout. The plugin writes, into
the codegen ``out`` directory:

- ``models.py``: a ``StrEnum`` per PostgreSQL enum and a slotted dataclass per
  table (its row);
- one module per query file (``db/query/jobs.sql`` -> ``jobs.py``) with, per
  named query, the SQL text as a constant (and its Row / Params dataclasses),
  and a class ``Queries`` with one typed method per query running it through
  a ``psycopg.RawCursor`` (server-side binding, sqlc's ``$n`` placeholders
  unchanged): ``Queries(schema=...).claim_jobs(conn, owner=...)``;
- ``_schema.py``: ``QueriesBase``, the base of those classes, which holds the
  PostgreSQL schema the queries run in and rewrites their SQL for a schema
  other than the default (see RUNTIME below for what it rewrites);
- ``__init__.py``: ``Queries``, inheriting every module's ``Queries``;
- ``aio/``: the asyncio variant, from the same source, the way psycopg
  offers ``AsyncConnection`` beside ``Connection``: ``aio/jobs.py`` holds
  ``AsyncQueries``, whose methods are the ``Queries`` methods as coroutines on
  a ``psycopg.AsyncConnection`` (``psycopg.AsyncRawCursor``, awaited; a
  :copyfrom through ``async with cur.copy(...)``). It imports the SQL
  constants and the Row / Params dataclasses from ``jobs.py``: the SQL exists
  once. ``aio/__init__.py``: ``AsyncQueries``, inheriting every one of them.
  ``await AsyncQueries(schema=...).claim_jobs(aconn, owner=...)``.

A ``:many`` query whose comments include the line ``-- @deferred`` also gets
``<name>_deferred(conn, ...)``: it sends the statement at once and returns a
function (a coroutine function in aio/) that reads the rows, so that in a
psycopg pipeline the statements sent after it, COMMIT among them, leave in
the same round trip. The directive is left out of the docstrings.

A comment line ``-- @nullable col [col ...]`` names result columns that may
be NULL although sqlc infers them NOT NULL (it does so for any cast, e.g. a
``CASE`` without ``ELSE`` or an aggregate over no rows, cast with ``::``):
their fields are typed ``X | None`` and converted only when not None. A name
that is no result column of the query is an error.

Everything it cannot map (a type, a command, an ``any`` column) is an error
naming the query: the plugin exits 1 with all problems on stderr.

Plugin options (``codegen[].options`` in sqlc.yaml):

- ``package`` (required): the dotted import name of the ``out`` directory; the
  query modules import their models from ``<package>.models``.
- ``schema``: the schema the queries name, qualified (``jobrun.jobs``): the
  default of ``Queries(schema=...)``, the name rewritten for another schema,
  and a schema whose models take no prefix. Without it, sqlc's default
  schema (``public``).

Stdlib only, Python 3.11+.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import keyword
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

GENERATOR = "sqlc-gen-psycopg"
# Bump when the generated code changes shape, so that the header tells apart
# outputs of different plugin versions.
GENERATOR_VERSION = "6"
DEFERRED = "@deferred"
"""The comment line asking for a :many query's deferred twin (see Query.deferred)."""
NULLABLE = "@nullable"
"""The comment line naming result columns that may be NULL (sqlc says NOT NULL)."""

# The generated code follows ruff format's style at this line length.
LINE_LENGTH = 100

SUPPORTED_COMMANDS = (
    ":one",
    ":many",
    ":exec",
    ":execrows",
    ":copyfrom",
    ":batchexec",
    ":batchone",
    ":batchmany",
)

# Schemas whose tables are PostgreSQL's own, not the project's.
_SYSTEM_SCHEMAS = frozenset({"pg_catalog", "information_schema", "pg_temp", "pg_toast"})


class PluginError(Exception):
    """A problem with the request: reported on stderr, exit status 1."""


# --------------------------------------------------------------------------- types


@dataclass(frozen=True)
class Scalar:
    """How one PostgreSQL base type maps to Python."""

    annotation: str  # the Python annotation of one value
    imports: tuple[str, ...]  # modules the annotation needs (`import x`)
    copy_type: str  # the type name for Copy.set_types()
    json_wrapper: str | None = None  # psycopg wrapper for parameters (Jsonb, Json)


_SCALARS: dict[str, Scalar] = {
    "uuid": Scalar("uuid.UUID", ("uuid",), "uuid"),
    "text": Scalar("str", (), "text"),
    "varchar": Scalar("str", (), "text"),
    "bpchar": Scalar("str", (), "text"),
    "name": Scalar("str", (), "text"),
    "citext": Scalar("str", (), "text"),
    "int2": Scalar("int", (), "int2"),
    "int4": Scalar("int", (), "int4"),
    "int8": Scalar("int", (), "int8"),
    "bool": Scalar("bool", (), "bool"),
    "float4": Scalar("float", (), "float4"),
    "float8": Scalar("float", (), "float8"),
    "numeric": Scalar("decimal.Decimal", ("decimal",), "numeric"),
    "jsonb": Scalar("Any", (), "jsonb", "Jsonb"),
    "json": Scalar("Any", (), "json", "Json"),
    "timestamptz": Scalar("datetime.datetime", ("datetime",), "timestamptz"),
    "timestamp": Scalar("datetime.datetime", ("datetime",), "timestamp"),
    "date": Scalar("datetime.date", ("datetime",), "date"),
    "time": Scalar("datetime.time", ("datetime",), "time"),
    "timetz": Scalar("datetime.time", ("datetime",), "timetz"),
    "interval": Scalar("datetime.timedelta", ("datetime",), "interval"),
    "bytea": Scalar("bytes", (), "bytea"),
    "void": Scalar("None", (), ""),
}

# The spellings sqlc passes through from the SQL (it keeps what the schema or
# a cast wrote), mapped to the names above.
_ALIASES: dict[str, str] = {
    "smallint": "int2",
    "smallserial": "int2",
    "serial2": "int2",
    "int": "int4",
    "integer": "int4",
    "serial": "int4",
    "serial4": "int4",
    "bigint": "int8",
    "bigserial": "int8",
    "serial8": "int8",
    "boolean": "bool",
    "real": "float4",
    "float": "float8",
    "double precision": "float8",
    "decimal": "numeric",
    "character varying": "varchar",
    "character": "bpchar",
    "char": "bpchar",
    "string": "text",
    "timestamp with time zone": "timestamptz",
    "timestamp without time zone": "timestamp",
    "time without time zone": "time",
    "time with time zone": "timetz",
}

_UNKNOWN_TYPES = frozenset({"any", "anyarray", "anyelement", "unknown", "anynonarray", "record"})


@dataclass(frozen=True)
class PyType:
    """A column or parameter type: a scalar or enum, maybe an array, maybe NULL."""

    base: str  # Python annotation of one element
    imports: tuple[str, ...]
    copy_type: str  # element type name for Copy.set_types()
    json_wrapper: str | None
    enum: str | None  # the StrEnum class name for an enum
    dims: int  # array dimensions, 0 for a scalar
    nullable: bool
    key: str  # canonical PostgreSQL identity, to compare columns

    @property
    def annotation(self) -> str:
        text = self.base
        for _ in range(self.dims):
            text = f"list[{text}]"
        if self.nullable and text not in ("Any", "None"):
            text += " | None"
        return text

    @property
    def is_void(self) -> bool:
        return self.base == "None" and self.dims == 0

    @property
    def binary_copy_ok(self) -> bool:
        # In binary COPY an enum value travels as text (enum_recv reads the
        # label as text), but an enum *array* carries its element type oid,
        # which psycopg only knows once the type is registered: text COPY then.
        return not (self.enum is not None and self.dims > 0)

    @property
    def set_types_name(self) -> str:
        return self.copy_type + "[]" * self.dims


# --------------------------------------------------------------------------- names


_WORD = re.compile(r"[A-Z]{2,}s(?![a-z])|[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

# Names a generated field must not take: Python keywords and the names the
# annotations use (a field `uuid: uuid.UUID` would shadow the module).
_FIELD_RESERVED = frozenset(
    {
        *keyword.kwlist,
        "Any",
        "bool",
        "bytes",
        "datetime",
        "decimal",
        "float",
        "int",
        "list",
        "str",
        "uuid",
    }
)
# A parameter must not take those either, nor the generated functions' own
# locals and the module-level names their bodies use.
_PARAM_RESERVED = _FIELD_RESERVED | {
    "Json",
    "Jsonb",
    "conn",
    "copy",
    "count",
    "cur",
    "p",
    "psycopg",
    "r",
    "result",
    "rows",
    "self",
    "tuple_row",
    "v",
    "value",
}


def words(name: str) -> list[str]:
    """Split a CamelCase, snake_case or mixed name into lower-case words."""
    out: list[str] = []
    for chunk in re.split(r"[^A-Za-z0-9]+", name):
        out.extend(w.lower() for w in _WORD.findall(chunk))
    return out


def snake(name: str) -> str:
    """``ListJobIDs`` -> ``list_job_ids``."""
    return "_".join(words(name))


def camel(name: str) -> str:
    """``job_state`` -> ``JobState``."""
    return "".join(w[:1].upper() + w[1:] for w in words(name))


def singular(word: str) -> str:
    """English singular of a table-name word: good enough for table names."""
    if len(word) <= 3 or word.endswith(("ss", "us", "is")):
        return word
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "zes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s"):
        return word[:-1]
    return word


def model_class_name(schema: str, name: str, default_schema: str) -> str:
    """``jobs`` -> ``Job``, ``job_events`` -> ``JobEvent``, ``audit.entries`` -> ``AuditEntry``."""
    parts = words(name)
    if not parts:
        raise PluginError(f"table {name!r}: cannot derive a class name")
    parts[-1] = singular(parts[-1])
    prefix = camel(schema) if schema and schema != default_schema else ""
    return prefix + "".join(w[:1].upper() + w[1:] for w in parts)


def enum_class_name(schema: str, name: str, default_schema: str) -> str:
    prefix = camel(schema) if schema and schema != default_schema else ""
    result = prefix + camel(name)
    if not result:
        raise PluginError(f"enum {name!r}: cannot derive a class name")
    return result


def identifier(name: str, fallback: str, reserved: frozenset[str] = _FIELD_RESERVED) -> str:
    """A safe snake_case Python identifier for a column or parameter name."""
    text = "_".join(words(name)) if re.search(r"[A-Z]", name) else name
    text = re.sub(r"[^0-9a-zA-Z_]+", "_", text).strip("_")
    if not text:
        text = fallback
    if text[0].isdigit():
        text = "_" + text
    if text in reserved or text == "_":
        text += "_"
    return text


def dedupe(names: Iterable[str]) -> list[str]:
    """``[a, a, b]`` -> ``[a, a_2, b]`` (like sqlc-gen-go's ``Name_2``)."""
    seen: set[str] = set()
    out: list[str] = []
    for name in names:
        candidate, n = name, 1
        while candidate in seen:
            n += 1
            candidate = f"{name}_{n}"
        seen.add(candidate)
        out.append(candidate)
    return out


def enum_member_names(labels: Sequence[str]) -> list[str]:
    names = []
    for label in labels:
        text = re.sub(r"[^0-9A-Za-z]+", "_", label).strip("_").upper()
        if not text:
            text = "EMPTY"
        if text[0].isdigit():
            text = "V_" + text
        names.append(text)
    return dedupe(names)


def py_string(text: str) -> str:
    """A Python literal for ``text``: triple-quoted when multi-line, else double-quoted."""
    if "\n" in text and all(c.isprintable() or c in "\n\t" for c in text):
        body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        if body.endswith('"'):
            body = body[:-1] + '\\"'
        return '"""\\\n' + body + '"""'
    # JSON string escapes are valid Python escapes.
    return json.dumps(text, ensure_ascii=False)


def assignment(name: str, literal: str) -> list[str]:
    """``NAME: Final = literal``, parenthesized like ruff format when too long."""
    line = f"{name}: Final = {literal}"
    if len(line) <= LINE_LENGTH or "\n" in literal or len(literal) + 4 > LINE_LENGTH:
        return [line]
    return [f"{name}: Final = (", f"    {literal}", ")"]


# --------------------------------------------------------------------------- request


@dataclass
class Enum:
    schema: str
    name: str
    class_name: str
    labels: list[str]
    members: list[str]


@dataclass
class Field:
    name: str  # the Python field / parameter name
    type: PyType


@dataclass
class Table:
    schema: str
    name: str
    class_name: str
    fields: list[Field]
    column_names: list[str]


@dataclass
class Param:
    number: int
    name: str
    type: PyType


@dataclass
class Query:
    name: str
    cmd: str
    text: str
    filename: str
    comments: list[str]
    params: list[Param]
    columns: list[Field]
    # The shared model the result reuses, when the columns are a table's.
    model: Table | None = None
    copy_columns: list[str] = field(default_factory=list)
    copy_table: str = ""
    # ``-- @deferred`` among a :many query's comments: also a ``<name>_deferred``
    # method that sends the statement and returns a function reading its rows.
    deferred: bool = False


class Context:
    """The catalog of one request: enums and tables by name."""

    def __init__(self, request: dict[str, Any], schema: str | None = None) -> None:
        catalog = request.get("catalog") or {}
        self.default_schema: str = catalog.get("default_schema") or "public"
        # The schema the generated queries are bound to (plugin option schema).
        self.schema: str = schema or self.default_schema
        # Models of these schemas take no schema prefix: Job, not JobrunJob.
        unprefixed = {self.default_schema, self.schema}
        self.enums: dict[tuple[str, str], Enum] = {}
        self.tables: dict[tuple[str, str], Table] = {}
        self.needs_enum_array_parser = False
        schemas = [s for s in catalog.get("schemas") or [] if s["name"] not in _SYSTEM_SCHEMAS]
        for schema in schemas:
            sname = schema["name"] or self.default_schema
            for e in schema.get("enums") or []:
                labels = list(e.get("vals") or [])
                self.enums[(sname, e["name"])] = Enum(
                    schema=sname,
                    name=e["name"],
                    class_name=enum_class_name(
                        "" if sname in unprefixed else sname, e["name"], self.default_schema
                    ),
                    labels=labels,
                    members=enum_member_names(labels),
                )
        for schema in schemas:
            sname = schema["name"] or self.default_schema
            for t in schema.get("tables") or []:
                rel = t["rel"]
                tname = rel["name"]
                tschema = rel.get("schema") or sname
                where = f"table {tschema}.{tname}"
                columns = t.get("columns") or []
                names = dedupe(
                    identifier(c["name"], f"column_{i + 1}") for i, c in enumerate(columns)
                )
                fields = [
                    Field(n, self.resolve(c, where=f"{where}: column {c['name']!r}"))
                    for n, c in zip(names, columns, strict=True)
                ]
                self.tables[(tschema, tname)] = Table(
                    schema=tschema,
                    name=tname,
                    class_name=model_class_name(
                        "" if tschema in unprefixed else tschema, tname, self.default_schema
                    ),
                    fields=fields,
                    column_names=[c["name"] for c in columns],
                )
        self._check_model_names()

    def _check_model_names(self) -> None:
        seen: dict[str, str] = {}
        for key, e in self.enums.items():
            seen.setdefault(e.class_name, f"enum {key[0]}.{key[1]}")
        for key, t in self.tables.items():
            other = seen.get(t.class_name)
            if other is not None:
                raise PluginError(
                    f"table {key[0]}.{key[1]} and {other} both map to the Python class "
                    f"{t.class_name!r}; rename one of them"
                )
            seen[t.class_name] = f"table {key[0]}.{key[1]}"
        # The query modules define Queries (AsyncQueries) and import QueriesBase.
        for name in ("Queries", "AsyncQueries", "QueriesBase"):
            if name in seen:
                raise PluginError(
                    f"{seen[name]} maps to the Python class {name!r}, a name of the "
                    "generated query modules; rename it"
                )

    def resolve(self, column: dict[str, Any], *, where: str) -> PyType:
        """The PyType of a sqlc Column (of a table, a result or a parameter)."""
        if column.get("embed_table"):
            raise PluginError(f"{where}: sqlc.embed() is not supported by {GENERATOR}")
        if column.get("is_sqlc_slice"):
            raise PluginError(
                f"{where}: sqlc.slice() is not supported on PostgreSQL; "
                "use = ANY(sqlc.arg(x)::type[])"
            )
        t = column.get("type") or {}
        schema = t.get("schema") or ""
        raw = t.get("name") or ""
        if not schema and "." in raw:
            # Parameters carry the qualified name in `name`: "pg_catalog.int4".
            schema, raw = raw.split(".", 1)
        name = raw.lower()
        is_array = bool(column.get("is_array"))
        dims = int(column.get("array_dims") or 0) if is_array else 0
        if is_array and dims == 0:
            dims = 1
        nullable = not column.get("not_null")
        shown = f"{schema}.{raw}" if schema else raw
        if name.endswith("[]"):  # defensive: sqlc normally uses is_array
            stripped = name.rstrip("[]")
            dims += (len(name) - len(stripped)) // 2
            name = stripped
        if schema in ("", "pg_catalog") and name in _UNKNOWN_TYPES:
            raise PluginError(
                f"{where}: type {shown!r} is unknown (sqlc could not infer it); "
                "add an explicit cast in the SQL, e.g. expr::int"
            )
        enum = self.enums.get((schema or self.default_schema, raw))
        if enum is None and not schema:
            # Unqualified: search the other user schemas like search_path would.
            matches = [e for (s, n), e in sorted(self.enums.items()) if n == raw]
            enum = matches[0] if len(matches) == 1 else None
        if enum is not None:
            return PyType(
                base=enum.class_name,
                imports=(),
                copy_type="text",
                json_wrapper=None,
                enum=enum.class_name,
                dims=dims,
                nullable=nullable,
                key=f"enum:{enum.schema}.{enum.name}",
            )
        if schema not in ("", "pg_catalog"):
            raise PluginError(f"{where}: cannot map type {shown!r} to a Python type")
        canonical = _ALIASES.get(name, name)
        scalar = _SCALARS.get(canonical)
        if scalar is None:
            raise PluginError(
                f"{where}: cannot map type {shown!r} to a Python type "
                f"(known: {', '.join(sorted(_SCALARS))} and the schema's enums)"
            )
        if canonical == "void" and dims:
            raise PluginError(f"{where}: cannot map type {shown!r}[] to a Python type")
        return PyType(
            base=scalar.annotation,
            imports=scalar.imports,
            copy_type=scalar.copy_type,
            json_wrapper=scalar.json_wrapper,
            enum=None,
            dims=dims,
            nullable=nullable,
            key=canonical,
        )

    def table_of(self, ref: dict[str, Any] | None) -> Table | None:
        if not ref or not ref.get("name"):
            return None
        return self.tables.get((ref.get("schema") or self.default_schema, ref["name"]))


def parse_options(raw: str | None) -> dict[str, Any]:
    """Decode sqlc's base64 ``plugin_options`` (JSON of ``codegen[].options``)."""
    if not raw:
        return {}
    try:
        decoded = base64.b64decode(raw, validate=True)
        options = json.loads(decoded) if decoded.strip() else {}
    except (binascii.Error, ValueError) as exc:
        raise PluginError(f"plugin_options is not base64-encoded JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise PluginError("plugin options must be a mapping")
    unknown = sorted(set(options) - {"package", "schema"})
    if unknown:
        raise PluginError(
            f"unknown plugin option(s): {', '.join(unknown)} (known: package, schema)"
        )
    return options


_SCHEMA_OPTION = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_$]*")


def quote_ident(name: str) -> str:
    """``name`` as an SQL identifier: bare when plain lower-case, else double-quoted."""
    if _PLAIN_NAME.fullmatch(name):
        return name
    return '"' + name.replace('"', '""') + '"'


_COPY_SHAPE = "INSERT INTO table (columns) VALUES ($1, ...)"
_INSERT = re.compile(
    r"""^\s*INSERT\s+INTO\s+
    (?P<table>(?:(?P<schema>"(?:[^"]|"")+"|[A-Za-z_][\w$]*)\s*\.\s*)?
        (?:"(?:[^"]|"")+"|[A-Za-z_][\w$]*))
    \s*\((?P<columns>[^)]*)\)\s*
    VALUES\s*\((?P<values>[^)]*)\)\s*;?\s*$""",
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)


def copy_target(query: Query, default_schema: str) -> tuple[str, list[str], list[int]]:
    """Table, columns and, per column, the parameter number of a :copyfrom INSERT.

    The table is schema-qualified: as the INSERT wrote it, or else with the
    schema sqlc resolved the bare name in (the catalog's default schema).
    """
    m = _INSERT.match(query.text)
    if m is None:
        raise PluginError(
            f"query {query.name!r} ({query.filename}): :copyfrom needs a plain {_COPY_SHAPE}"
        )
    columns = [c.strip() for c in m["columns"].split(",")]
    values = [v.strip() for v in m["values"].split(",")]
    numbers = []
    for v in values:
        pm = re.fullmatch(r"\$(\d+)", v)
        if pm is None:
            raise PluginError(
                f"query {query.name!r} ({query.filename}): :copyfrom value {v!r} is not a "
                "plain parameter"
            )
        numbers.append(int(pm[1]))
    if len(columns) != len(values):
        raise PluginError(f"query {query.name!r} ({query.filename}): columns/values mismatch")
    if len(set(numbers)) != len(numbers):
        raise PluginError(
            f"query {query.name!r} ({query.filename}): :copyfrom uses a parameter twice; "
            "COPY needs one parameter per column"
        )
    table = m["table"] if m["schema"] else f"{quote_ident(default_schema)}.{m['table']}"
    return table, columns, numbers


def check_schema_references(query: Query, schema: str) -> None:
    """Fail when ``query`` names ``schema`` other than as ``schema.name``.

    The schema rewrite (runtime()'s rebind) replaces a qualifier only: the
    schema's name standing alone (an alias or a table of that name, or
    ``schema . name`` spaced out) would be missed or wrongly replaced.
    """
    identifiers = runtime(schema)["identifiers"]
    for start, end, name in identifiers(query.text):
        if name == schema and not query.text.startswith(".", end):
            line = query.text.count("\n", 0, start) + 1
            raise PluginError(
                f"query {query.name!r} ({query.filename}): line {line} of the query names "
                f"{schema!r} without a dot right after it; the name of the schema the "
                f"queries are bound to (plugin option schema) may appear only as a "
                f"qualifier, as in {schema}.jobs, since only those are rewritten for "
                "another schema at run time"
            )


def build_queries(request: dict[str, Any], ctx: Context) -> tuple[list[Query], list[str]]:
    """The queries of the request, validated; and every error found."""
    queries: list[Query] = []
    errors: list[str] = []
    for q in request.get("queries") or []:
        name, cmd, filename = q.get("name", ""), q.get("cmd", ""), q.get("filename", "")
        where = f"query {name!r} ({filename})"
        try:
            if cmd not in SUPPORTED_COMMANDS:
                raise PluginError(
                    f"{where}: command {cmd!r} is not supported "
                    f"(supported: {' '.join(SUPPORTED_COMMANDS)})"
                )
            params = sorted(q.get("params") or [], key=lambda p: p["number"])
            numbers = [p["number"] for p in params]
            if numbers != list(range(1, len(params) + 1)):
                raise PluginError(f"{where}: parameters are not numbered $1..$n: {numbers}")
            pnames = dedupe(
                identifier(p["column"].get("name") or "", f"param_{p['number']}", _PARAM_RESERVED)
                for p in params
            )
            plist = [
                Param(
                    number=p["number"],
                    name=n,
                    type=ctx.resolve(
                        p["column"], where=f"{where}: parameter ${p['number']} ({n}) of {cmd}"
                    ),
                )
                for n, p in zip(pnames, params, strict=True)
            ]
            returns_rows = cmd in (":one", ":many", ":batchone", ":batchmany")
            columns: list[Field] = []
            raw_columns = q.get("columns") or []
            if returns_rows:
                if not raw_columns:
                    raise PluginError(f"{where}: {cmd} needs a query that returns columns")
                cnames = dedupe(
                    identifier(c.get("name") or "", f"column_{i + 1}")
                    for i, c in enumerate(raw_columns)
                )
                columns = [
                    Field(
                        n,
                        ctx.resolve(c, where=f"{where}: result column {c.get('name')!r} of {cmd}"),
                    )
                    for n, c in zip(cnames, raw_columns, strict=True)
                ]
                if any(f.type.enum and f.type.dims > 1 for f in columns):
                    raise PluginError(f"{where}: multi-dimensional enum arrays are not supported")
                if any(f.type.enum and f.type.dims == 1 for f in columns):
                    ctx.needs_enum_array_parser = True
            comments = [c.strip() for c in q.get("comments") or []]
            deferred = DEFERRED in comments
            if deferred and cmd != ":many":
                raise PluginError(f"{where}: {DEFERRED} applies to :many queries only")
            directives = [c for c in comments if c == DEFERRED or c.startswith(NULLABLE + " ")]
            nullable = {n for c in directives if c != DEFERRED for n in c.split()[1:]}
            unknown = sorted(nullable - {f.name for f in columns})
            if unknown:
                raise PluginError(f"{where}: {NULLABLE} names no result column {unknown[0]!r}")
            columns = [
                Field(f.name, dataclasses.replace(f.type, nullable=True))
                if f.name in nullable
                else f
                for f in columns
            ]
            query = Query(
                name=name,
                cmd=cmd,
                text=q.get("text", ""),
                filename=filename,
                comments=[c for c in comments if c not in directives],
                params=plist,
                columns=columns,
                deferred=deferred,
            )
            if returns_rows and len(columns) > 1:
                query.model = matching_model(ctx, raw_columns, columns)
            check_schema_references(query, ctx.schema)
            if cmd == ":copyfrom":
                table, cols, nums = copy_target(query, ctx.default_schema)
                query.copy_table = table
                query.copy_columns = cols
                if sorted(nums) != [p.number for p in plist]:
                    raise PluginError(f"{where}: :copyfrom parameters do not match the columns")
                # COPY writes values in the text's column order.
                order = {n: i for i, n in enumerate(nums)}
                query.params = sorted(plist, key=lambda p: order[p.number])
            queries.append(query)
        except PluginError as exc:
            errors.append(str(exc))
    return queries, errors


def matching_model(
    ctx: Context, raw_columns: list[dict[str, Any]], columns: list[Field]
) -> Table | None:
    """The table whose row these result columns exactly are, if any.

    The columns must carry the table's names and types in its order. sqlc
    names the source table of a plain query; the result of a data-modifying
    CTE (``WITH ins AS (INSERT ... RETURNING *) SELECT ins.* FROM ins``)
    names the CTE instead, so then the one table with exactly those columns
    is the model (none when several tables would fit).
    """
    table = ctx.table_of(raw_columns[0].get("table"))
    if table is not None:
        return table if _same_columns(table, raw_columns, columns) else None
    fits = [t for _, t in sorted(ctx.tables.items()) if _same_columns(t, raw_columns, columns)]
    return fits[0] if len(fits) == 1 else None


def _same_columns(table: Table, raw_columns: list[dict[str, Any]], columns: list[Field]) -> bool:
    if len(table.fields) != len(columns):
        return False
    return all(
        raw.get("name") == tname and col.type == tfield.type
        for raw, col, tfield, tname in zip(
            raw_columns, columns, table.fields, table.column_names, strict=True
        )
    )


# --------------------------------------------------------------------------- emit


def _natural(text: str) -> list[str | int]:
    """``"x_10"`` -> ``["x_", 10, ""]``: digits compare as numbers."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text))]


def member_key(name: str) -> tuple[int, list[str | int], list[str | int]]:
    """The order of the names of one ``from x import ...``, as ruff's isort sorts them.

    Constants (``CLAIM_JOBS``) first, then classes (``ClaimJobsRow``), then
    the rest (``parse_enum_array``); in each group case-insensitively, in
    natural order (``X_9`` before ``X_10``).
    """
    if len(name) > 1 and name.isupper():
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    return kind, _natural(name.lower()), _natural(name)


class Module:
    """Lines of one generated module plus the imports they need."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.imports: set[str] = set()  # `import x`
        self.from_imports: dict[str, set[str]] = {}  # `from x import y`

    def need(self, module: str, name: str | None = None) -> None:
        if name is None:
            self.imports.add(module)
        else:
            self.from_imports.setdefault(module, set()).add(name)

    def need_type(self, t: PyType) -> None:
        self.imports.update(t.imports)
        if t.base == "Any":
            self.need("typing", "Any")

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def render(self, header: list[str], docstring: str) -> str:
        """The module text: header, docstring, isort-style imports, body."""

        def group(module: str) -> int:
            top = module.split(".", maxsplit=1)[0]
            if top == "psycopg":
                return 1
            return 0 if top in sys.stdlib_module_names else 2

        blocks: list[list[str]] = [[], [], []]
        for m in sorted(self.imports):
            blocks[group(m)].append(f"import {m}")
        for m, names in sorted(self.from_imports.items()):
            members = sorted(names, key=member_key)
            line = f"from {m} import {', '.join(members)}"
            if len(line) > LINE_LENGTH:  # isort's parenthesized form, one name a line
                line = "\n".join([f"from {m} import (", *[f"    {n}," for n in members], ")"])
            blocks[group(m)].append(line)
        out = [*header, f'"""{docstring}"""']
        for block in blocks:
            if block:
                # isort order: `import x` lines first, then `from x import y`.
                out.extend(["", *sorted(block, key=lambda line: line.startswith("from "))])
        body = list(self.lines)
        while body and body[0] == "":
            body.pop(0)
        if body:
            # isort: two blank lines before a def or class, one before the rest.
            gap = 2 if re.match(r"(@|def |class )", body[0]) else 1
            out.extend(["" for _ in range(gap)] + body)
        return "\n".join(out).rstrip("\n") + "\n"


def header(request: dict[str, Any], source: str) -> list[str]:
    version = request.get("sqlc_version") or "unknown"
    return [
        f"# Code generated by {GENERATOR} from {source}. DO NOT EDIT.",
        "# versions:",
        f"#   sqlc {version}",
        f"#   {GENERATOR} {GENERATOR_VERSION}",
    ]


def emit_dataclass(mod: Module, class_name: str, fields: list[Field], doc: str | None) -> None:
    """A slotted keyword-only dataclass, not frozen: rows are decoded by the
    thousand (every claimed job is one), and a frozen dataclass's ``__init__``
    (``object.__setattr__`` per field) costs about 1.6 times as much: 7 µs of
    the worker's time per job for a 30-column row of jobs."""
    mod.need("dataclasses")
    options = "slots=True, kw_only=True"
    mod.add("", "", f"@dataclasses.dataclass({options})")
    mod.add(f"class {class_name}:")
    if doc:
        mod.add(f'    """{doc}"""', "")
    for f in fields:
        mod.need_type(f.type)
        mod.add(f"    {f.name}: {f.type.annotation}")
    if not fields:
        mod.add("    pass")


def value_expr(t: PyType, src: str, enum_import: set[str]) -> str:
    """Python expression converting the loaded value ``src`` to ``t``."""
    if t.is_void:
        return "None"
    if t.enum is None:
        return src
    enum_import.add(t.enum)
    if t.dims == 0:
        conv = f"{t.enum}({src})"
    else:
        enum_import.add("parse_enum_array")
        conv = f"parse_enum_array({t.enum}, {src})"
    return f"({conv} if {src} is not None else None)" if t.nullable else conv


def json_wrap(wrapper: str, src: str) -> str:
    """Wrap a JSON value for psycopg, passing an already wrapped one through.

    A caller holding the JSON text already (validated once, say) passes
    ``Jsonb(text, dumps=<identity>)`` and skips a second serialisation.
    """
    return f"{src} if isinstance({src}, {wrapper}) else {wrapper}({src})"


def param_expr(t: PyType, src: str, mod: Module) -> Node | str:
    """Python expression adapting the argument ``src`` for psycopg."""
    if t.json_wrapper is None:
        return src
    mod.need("psycopg.types.json", t.json_wrapper)
    w = t.json_wrapper
    conv: Node | str
    if t.dims == 0:
        conv = f"({json_wrap(w, src)})" if t.nullable else json_wrap(w, src)
    elif t.dims == 1:
        # None elements stay SQL NULLs; wrapped values pass through.
        conv = Node(
            "[",
            [f"v if v is None or isinstance(v, {w}) else {w}(v)", f"for v in {src}"],
            "]",
            comma=False,
        )
    else:
        raise PluginError(f"multi-dimensional {t.copy_type} arrays are not supported")
    if not t.nullable:
        return conv
    # Split like ruff format when too long: the value, its condition, the else.
    return Node("(", [conv, f"if {src} is not None", "else None"], ")", comma=False)


@dataclass
class Node:
    """A bracketed expression the layout may split over lines, ruff-format style."""

    open: str  # "Job(", "[", "("
    items: list[Node | str]
    close: str  # ")", "]"
    comma: bool = True  # items are comma-separated (a call, a tuple), else a comprehension


def call(func: str, args: Sequence[Node | str]) -> Node:
    return Node(f"{func}(", list(args), ")")


def tuple_node(items: Sequence[Node | str]) -> Node:
    return Node("(", list(items), ")")


def flat(x: Node | str) -> str:
    if isinstance(x, str):
        return x
    if not x.comma:
        return x.open + " ".join(flat(i) for i in x.items) + x.close
    inner = ", ".join(flat(i) for i in x.items)
    if x.open == "(" and len(x.items) == 1:
        inner += ","  # a one-element tuple
    return x.open + inner + x.close


def layout(x: Node | str, indent: str, prefix: str = "", suffix: str = "") -> list[str]:
    """``prefix + x + suffix`` on one line if it fits, else split at brackets."""
    line = indent + prefix + flat(x) + suffix
    if isinstance(x, str) or len(line) <= LINE_LENGTH or not x.items:
        return [line]
    if not x.comma:  # a comprehension: its parts on one line when they fit there
        inner = indent + "    " + " ".join(flat(item) for item in x.items)
        if len(inner) <= LINE_LENGTH:
            return [indent + prefix + x.open, inner, indent + x.close + suffix]
    lines = [indent + prefix + x.open]
    for item in x.items:
        lines.extend(layout(item, indent + "    ", suffix="," if x.comma else ""))
    lines.append(indent + x.close + suffix)
    return lines


def signature(
    name: str, params: list[str], returns: str, indent: str = "", defn: str = "def"
) -> list[str]:
    one = f"{indent}{defn} {name}({', '.join(params)}) -> {returns}:"
    if len(one) <= LINE_LENGTH:
        return [one]
    return [
        f"{indent}{defn} {name}(",
        *[f"{indent}    {p}," for p in params],
        f"{indent}) -> {returns}:",
    ]


def docstring_lines(comments: list[str], indent: str) -> list[str]:
    text = [c.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') for c in comments]
    while text and not text[-1]:
        text.pop()
    while text and not text[0]:
        text.pop(0)
    if not text:
        return []
    if text[-1].endswith('"'):
        text[-1] += " "
    if len(text) == 1 and len(indent) + len(text[0]) + 6 <= LINE_LENGTH:
        return [f'{indent}"""{text[0]}"""']
    rest = [f"{indent}{t}" if t else "" for t in text[1:]]
    return [f'{indent}"""{text[0]}', *rest, f'{indent}"""']


def optional(annotation: str) -> str:
    """``X`` -> ``X | None``, leaving ``Any``, ``None`` and ``Y | None`` alone."""
    if annotation in ("Any", "None") or annotation.endswith(" | None"):
        return annotation
    return f"{annotation} | None"


@dataclass(frozen=True)
class Flavor:
    """What tells the sync methods from their asyncio twins (psycopg's two APIs)."""

    cls: str  # the class the methods go into
    conn: str  # the connection parameter
    cursor: str  # the cursor, as a context manager
    defn: str  # "def" or "async def"
    with_: str  # "with" or "async with"
    aw: str  # "" or "await "

    @property
    def cursor_line(self) -> str:
        return f"{self.with_} {self.cursor} as cur:"


SYNC = Flavor(
    cls="Queries",
    conn="conn: psycopg.Connection[Any]",
    cursor="psycopg.RawCursor(conn, row_factory=tuple_row)",
    defn="def",
    with_="with",
    aw="",
)
ASYNC = Flavor(
    cls="AsyncQueries",
    conn="conn: psycopg.AsyncConnection[Any]",
    cursor="psycopg.AsyncRawCursor(conn, row_factory=tuple_row)",
    defn="async def",
    with_="async with",
    aw="await ",
)
CURSOR = SYNC.cursor_line
CONN = SYNC.conn

# Indents inside a method of the Queries class: the def, then its body levels.
_DEF = " " * 4
_B1 = " " * 8
_B2 = " " * 12
_B3 = " " * 16
_B4 = " " * 20


def emit_query(
    mod: Module,
    methods: list[str],
    q: Query,
    enum_import: set[str],
    model_import: set[str],
    flavor: Flavor = SYNC,
    shared: set[str] | None = None,
) -> None:
    """The constant and dataclasses of ``q`` into ``mod``, its method into ``methods``.

    The ASYNC flavor defines nothing but the method: it names the constant
    and the Row / Params dataclasses of the sync module, collected in
    ``shared`` for the async module to import.
    """
    is_async = flavor is ASYNC
    if is_async and shared is None:
        raise ValueError("the async flavor needs the set of shared names")
    const = snake(q.name).upper()
    func = snake(q.name)
    cap = q.name[:1].upper() + q.name[1:]
    aw = flavor.aw
    cursor_line = flavor.cursor_line
    if not is_async:
        mod.need("typing", "Final")
    mod.need("typing", "Any")
    mod.need("psycopg")
    mod.need("psycopg.rows", "tuple_row")
    if shared is None:
        mod.add("", "", *assignment(const, py_string(q.text)))
    elif q.cmd != ":copyfrom":  # a COPY runs its own statement, {const}_COPY
        shared.add(const)
    sql = f"self.sql({const})"

    # The result: a bare value, a shared model or a per-query Row dataclass.
    row_class: str | None = None
    single: Field | None = None
    if len(q.columns) == 1:
        single = q.columns[0]
        mod.need_type(single.type)
    elif q.model is not None:
        row_class = q.model.class_name
        model_import.add(row_class)
    elif q.columns:
        row_class = f"{cap}Row"
        if shared is not None:
            shared.add(row_class)
        else:
            emit_dataclass(mod, row_class, q.columns, None)
    for f in q.columns:
        if f.type.enum:
            enum_import.add(f.type.enum)
    row_type = single.type.annotation if single is not None else row_class or "None"

    def build(src: str) -> Node | str:
        """The expression making one result value from the tuple ``src``."""
        if single is not None:
            return value_expr(single.type, f"{src}[0]", enum_import)
        assert row_class is not None
        return call(
            row_class,
            [
                f"{f.name}={value_expr(f.type, f'{src}[{i}]', enum_import)}"
                for i, f in enumerate(q.columns)
            ],
        )

    def all_rows() -> Node:
        return Node("[", [build("r"), f"for r in {aw}cur.fetchall()"], "]", comma=False)

    def add(*lines: str) -> None:
        methods.extend(lines)

    def sig(params: list[str], returns: str) -> list[str]:
        return signature(func, params, returns, _DEF, flavor.defn)

    doc = docstring_lines(q.comments, _B1)

    if q.cmd in (":copyfrom", ":batchexec", ":batchone", ":batchmany"):
        params_class = f"{cap}Params"
        if shared is not None:
            shared.add(params_class)
        else:
            fields = [Field(p.name, p.type) for p in q.params]
            emit_dataclass(mod, params_class, fields, f"One row of Queries.{func}().")
            for p in q.params:
                if p.type.enum:
                    enum_import.add(p.type.enum)
        if q.cmd == ":copyfrom":
            emit_copy(mod, methods, q, const, func, params_class, doc, flavor, shared)
            return
        mod.need("collections.abc", "Sequence")
        args = tuple_node([param_expr(p.type, f"p.{p.name}", mod) for p in q.params])
        gen = Node("(", [args, "for p in rows"], ")", comma=False)
        conn_rows = ["self", flavor.conn, f"rows: Sequence[{params_class}]"]
        if q.cmd == ":batchexec":
            add("", *sig(conn_rows, "None"), *doc, f"{_B1}{cursor_line}")
            add(*layout(call("cur.executemany", [sql, gen]), _B2, prefix=aw))
            return
        item = optional(row_type) if q.cmd == ":batchone" else f"list[{row_type}]"
        add("", *sig(conn_rows, f"list[{item}]"), *doc)
        add(
            f"{_B1}result: list[{item}] = []",
            f"{_B1}if not rows:",
            f"{_B2}return result",
            f"{_B1}{cursor_line}",
            *layout(call("cur.executemany", [sql, gen, "returning=True"]), _B2, prefix=aw),
            f"{_B2}while True:",
        )
        if q.cmd == ":batchone":
            add(
                f"{_B3}r = {aw}cur.fetchone()",
                f"{_B3}if r is None:",
                f"{_B4}result.append(None)",
                f"{_B3}else:",
                *layout(call("result.append", [build("r")]), _B4),
            )
        else:
            add(*layout(call("result.append", [all_rows()]), _B3))
        add(
            f"{_B3}if not cur.nextset():",
            f"{_B4}break",
            f"{_B1}return result",
        )
        return

    sig_params = ["self", flavor.conn]
    if q.params:
        sig_params.append("*")
    for p in q.params:
        mod.need_type(p.type)
        if p.type.enum:
            enum_import.add(p.type.enum)
        sig_params.append(f"{p.name}: {p.type.annotation}")
    execute_args: list[Node | str] = [sql]
    if q.params:
        execute_args.append(tuple_node([param_expr(p.type, p.name, mod) for p in q.params]))
    execute = [f"{_B1}{cursor_line}", *layout(call("cur.execute", execute_args), _B2, prefix=aw)]

    if q.cmd == ":exec":
        add("", *sig(sig_params, "None"), *doc, *execute)
    elif q.cmd == ":execrows":
        add("", *sig(sig_params, "int"), *doc, *execute)
        add(f"{_B2}return cur.rowcount")
    elif q.cmd == ":one":
        add("", *sig(sig_params, optional(row_type)), *doc, *execute)
        if single is not None and single.type.is_void:
            return  # nothing to return but that the statement ran
        add(f"{_B2}r = {aw}cur.fetchone()", f"{_B1}if r is None:", f"{_B2}return None")
        if single is not None and single.type.enum is None and row_type != "Any":
            # Through a typed local: returning the tuple's Any fails mypy --strict.
            add(f"{_B1}value: {row_type} = r[0]", f"{_B1}return value")
        else:
            add(*layout(build("r"), _B1, prefix="return "))
    elif q.cmd == ":many":
        add("", *sig(sig_params, f"list[{row_type}]"), *doc, *execute)
        add(*layout(all_rows(), _B2, prefix="return "))
        if q.deferred:
            # Sent now, read when asked: in a pipeline, statements sent after
            # this one (COMMIT among them) leave in the same round trip.
            mod.need("collections.abc", "Callable")
            if is_async:
                mod.need("collections.abc", "Awaitable")
                returns = f"Callable[[], Awaitable[list[{row_type}]]]"
            else:
                returns = f"Callable[[], list[{row_type}]]"
            note = [
                "",
                "Deferred: the statement is sent at once and its rows are read when",
                "the function returned is called (after what was sent meanwhile).",
            ]
            deferred_doc = docstring_lines([*q.comments, *note] if q.comments else note[1:], _B1)
            add(
                "",
                *signature(f"{func}_deferred", sig_params, returns, _DEF, flavor.defn),
                *deferred_doc,
                f"{_B1}cur = {flavor.cursor}",
                f"{_B1}try:",
                *layout(call("cur.execute", execute_args), _B2, prefix=aw),
                f"{_B1}except BaseException:",
                f"{_B2}{aw}cur.close()",
                f"{_B2}raise",
                "",
                f"{_B1}{flavor.defn} rows() -> list[{row_type}]:",
                f"{_B2}{flavor.with_} cur:",
                *layout(all_rows(), _B3, prefix="return "),
                "",
                f"{_B1}return rows",
            )


def emit_copy(
    mod: Module,
    methods: list[str],
    q: Query,
    const: str,
    func: str,
    params_class: str,
    doc: list[str],
    flavor: Flavor = SYNC,
    shared: set[str] | None = None,
) -> None:
    mod.need("collections.abc", "Iterable")
    binary = all(p.type.binary_copy_ok for p in q.params)
    if shared is not None:
        shared.update((f"{const}_COPY", f"{const}_COPY_TYPES"))
    else:
        fmt = " (FORMAT BINARY)" if binary else ""
        copy_sql = f"COPY {q.copy_table} ({', '.join(q.copy_columns)}) FROM STDIN{fmt}"
        types = tuple_node([json.dumps(p.type.set_types_name) for p in q.params])
        mod.add("", "", *assignment(f"{const}_COPY", py_string(copy_sql)))
        mod.add(*layout(types, "", prefix=f"{const}_COPY_TYPES: Final = "))
    sig = signature(
        func, ["self", flavor.conn, f"rows: Iterable[{params_class}]"], "int", _DEF, flavor.defn
    )
    methods.extend(["", *sig])
    if doc:
        methods.extend(doc)
    else:
        methods.append(
            f'{_B1}"""COPY the rows into {q.copy_table}; return how many were written."""'
        )
    if not binary:
        methods.append(f"{_B1}# Text COPY: binary COPY of an enum array needs its type registered.")
    contexts = [
        f"{flavor.cursor} as cur",
        f"cur.copy(self.sql({const}_COPY)) as copy",
    ]
    with_line = f"{_B1}{flavor.with_} {', '.join(contexts)}:"
    if len(with_line) > LINE_LENGTH:
        with_lines = [f"{_B1}{flavor.with_} (", *[f"{_B2}{c}," for c in contexts], f"{_B1}):"]
    else:
        with_lines = [with_line]
    # set_types() picks the dumpers, so values go in as they are, except that a
    # NOT NULL json value of None means JSON null, as in the other methods.
    values = tuple_node(
        [
            f"({json_wrap(p.type.json_wrapper, 'p.' + p.name)})"
            if p.type.json_wrapper and not p.type.nullable and not p.type.dims
            else f"p.{p.name}"
            for p in q.params
        ]
    )
    for p in q.params:
        if p.type.json_wrapper and not p.type.nullable and not p.type.dims:
            mod.need("psycopg.types.json", p.type.json_wrapper)
    methods.extend(
        [
            f"{_B1}count = 0",
            *with_lines,
            f"{_B2}copy.set_types({const}_COPY_TYPES)",
            f"{_B2}for p in rows:",
            *layout(call("copy.write_row", [values]), _B3, prefix=flavor.aw),
            f"{_B3}count += 1",
            f"{_B1}return count",
        ]
    )


ENUM_ARRAY_PARSER = '''

_E = TypeVar("_E", bound=enum.StrEnum)
_ARRAY_ITEM = re.compile(r'"((?:[^"\\\\]|\\\\.)*)"|([^,]+)')


def parse_enum_array(cls: type[_E], value: str | list[Any]) -> list[_E]:
    """Load a one-dimensional array of an enum.

    psycopg knows no loader for an enum array type it has not registered and
    returns PostgreSQL's text form, e.g. ``{queued,"odd label"}``.
    """
    if isinstance(value, list):
        return [cls(v) for v in value]
    body = value[value.index("=") + 1 :] if value.startswith("[") else value
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"not a one-dimensional array: {value!r}")
    result: list[_E] = []
    for m in _ARRAY_ITEM.finditer(body[1:-1]):
        quoted, bare = m.group(1), m.group(2)
        if bare is not None:
            if bare == "NULL":
                raise ValueError(f"NULL element in enum array: {value!r}")
            result.append(cls(bare))
        else:
            result.append(cls(re.sub(r"\\\\(.)", r"\\1", quoted)))
    return result'''

# --------------------------------------------------------------------------- runtime

# The generated package's _schema.py, after its header: the base of the Queries
# classes and the schema rewrite. The plugin runs the same code at generate
# time (runtime()) to check each query's use of the schema name.
RUNTIME = r'''"""The PostgreSQL schema the generated queries run in, chosen at run time.

Every query's SQL names its objects qualified with DEFAULT_SCHEMA, as written
in the .sql files (``@schema@.jobs``, ``@schema@.job_state``); so does the COPY
statement of a :copyfrom query. ``Queries(schema="myapp_jobs")`` runs the same
queries in another schema: each statement's text is rewritten the first time
it runs in that schema, then cached (per schema, for the whole process). With
DEFAULT_SCHEMA the text is used as it is: no rewrite, no copy, no lookup.

The rewrite replaces DEFAULT_SCHEMA's name where it qualifies a name, that is
an identifier immediately followed by a dot: ``@schema@.jobs``, ``@SCHEMA@.jobs``
(unquoted names fold to lower case), ``"@schema@".jobs``, ``@schema@.job_state[]``
in a cast, ``@schema@.f(...)``. The new name is written quoted
(``"myapp_jobs".jobs``), so that a schema whose name is an SQL keyword works.

It leaves alone what is not a name: string literals ('@schema@.x', E'...' with
backslash escapes, U&'...'), dollar-quoted strings ($$...$$, $tag$...$tag$),
comments (-- and nested /* */), and quoted identifiers other than exactly
"@schema@" (so "@schema@.x" is one name holding a dot, and a quoted name in
other letter case another schema). A schema named inside a string is therefore not rewritten:
to_regclass('@schema@.jobs'), set_config('search_path', ...), a function body in
dollar quotes; pass such a name as a parameter instead. Strings are read as
with standard_conforming_strings = on (PostgreSQL's default since 9.1).

DEFAULT_SCHEMA's name must mean the schema and nothing else in the queries:
the plugin refuses, at generate time, a query where the name stands without a
dot after it (``@schema@ . jobs``, or ``@schema@`` as a table, alias or column).
"""

import re
from collections.abc import Iterator
from typing import Final

DEFAULT_SCHEMA: Final = "@schema@"

_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# PostgreSQL's lexer: identifiers, dollar-quote tags, string bodies, comments.
_LETTER: Final = r"A-Za-z_\u0080-\U0010ffff"  # what may start an identifier
_WORD: Final = re.compile(rf"[{_LETTER}][{_LETTER}0-9$]*")
_DOLLAR_QUOTE: Final = re.compile(rf"\$(?:[{_LETTER}][{_LETTER}0-9]*)?\$")
_STRING_REST: Final = re.compile(r"[^']*(?:''[^']*)*'")
_ESCAPE_STRING_REST: Final = re.compile(r"[^'\\]*(?:(?:''|\\.)[^'\\]*)*'", re.DOTALL)
_QUOTED_REST: Final = re.compile(r'[^"]*(?:""[^"]*)*"')
_COMMENT_MARK: Final = re.compile(r"/\*|\*/")
_FOLD: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

# Statement texts rewritten for a schema: schema -> text as generated -> text.
_REWRITTEN: Final[dict[str, dict[str, str]]] = {}
# Texts cached per schema at most: the generated statements are far fewer, and
# hand-written SQL built anew on each call must not grow the cache forever.
_MAX_CACHED: Final = 1024


def check_schema(schema: str) -> str:
    """``schema`` when it is a plain lower-case identifier; else ValueError.

    ``[a-z_][a-z0-9_]*`` of at most 63 characters (PostgreSQL's limit), not
    starting with ``pg_`` (reserved for the system's own schemas).
    """
    if (
        not isinstance(schema, str)
        or _SCHEMA_NAME.fullmatch(schema) is None
        or schema.startswith("pg_")
    ):
        raise ValueError(
            f"invalid schema name {schema!r}: expected a plain lower-case identifier "
            "([a-z_][a-z0-9_]*, at most 63 characters) not starting with pg_"
        )
    return schema


def _after(pattern: re.Pattern[str], sql: str, pos: int) -> int:
    """The end of the token whose rest ``pattern`` matches at ``pos`` (unterminated: the end)."""
    m = pattern.match(sql, pos)
    return len(sql) if m is None else m.end()


def _comment_end(sql: str, pos: int) -> int:
    """The end of the (nested) block comment opening at ``pos``."""
    depth = 0
    for m in _COMMENT_MARK.finditer(sql, pos):
        depth += 1 if m[0] == "/*" else -1
        if depth == 0:
            return m.end()
    return len(sql)


def identifiers(sql: str) -> Iterator[tuple[int, int, str]]:
    """``(start, end, name)`` of every identifier in ``sql`` outside strings and comments.

    ``name`` is the identifier as PostgreSQL reads it: an unquoted one folded
    to lower case, a quoted one as written between its quotes. Keywords count
    as identifiers here.
    """
    pos, n = 0, len(sql)
    while pos < n:
        c = sql[pos]
        if c == "'":
            pos = _after(_STRING_REST, sql, pos + 1)
        elif c == '"':
            end = _after(_QUOTED_REST, sql, pos + 1)
            yield pos, end, sql[pos + 1 : end - 1].replace('""', '"')
            pos = end
        elif sql.startswith("--", pos):
            newline = sql.find("\n", pos)
            pos = n if newline < 0 else newline + 1
        elif sql.startswith("/*", pos):
            pos = _comment_end(sql, pos)
        elif c == "$" and (tag := _DOLLAR_QUOTE.match(sql, pos)) is not None:
            close = sql.find(tag[0], tag.end())
            pos = n if close < 0 else close + len(tag[0])
        elif (word := _WORD.match(sql, pos)) is not None:
            if word[0] in ("E", "e") and sql.startswith("'", word.end()):
                pos = _after(_ESCAPE_STRING_REST, sql, word.end() + 1)
            else:
                yield pos, word.end(), word[0].translate(_FOLD)
                pos = word.end()
        else:
            pos += 1


def rebind(sql: str, schema: str, default: str = DEFAULT_SCHEMA) -> str:
    """``sql`` with each qualifier naming the ``default`` schema naming ``schema``."""
    check_schema(schema)
    if schema == default:
        return sql
    parts: list[str] = []
    last = 0
    for start, end, name in identifiers(sql):
        if name == default and sql.startswith(".", end):
            parts.append(sql[last:start])
            parts.append(f'"{schema}"')
            last = end
    parts.append(sql[last:])
    return "".join(parts)


class QueriesBase:
    """The base of every generated ``Queries`` class: the schema the queries run in.

    ``Queries()`` runs them in DEFAULT_SCHEMA, ``Queries(schema="myapp_jobs")``
    in that schema (a ValueError for a name check_schema refuses). An instance
    holds no connection and no state but the schema: share one freely.
    """

    __slots__ = ("_schema", "_texts")

    _schema: str
    _texts: dict[str, str] | None

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        self._schema = check_schema(schema)
        self._texts = None if schema == DEFAULT_SCHEMA else _REWRITTEN.setdefault(schema, {})

    @property
    def schema(self) -> str:
        """The schema the queries run in."""
        return self._schema

    def sql(self, text: str) -> str:
        """``text``, SQL qualified with DEFAULT_SCHEMA, for this schema.

        The generated methods run their statements through here; hand-written
        SQL qualified the same way can too (see the module's docstring).
        """
        texts = self._texts
        if texts is None:
            return text
        found = texts.get(text)
        if found is None:
            found = rebind(text, self._schema)
            if len(texts) < _MAX_CACHED:
                texts[text] = found
        return found

    def __repr__(self) -> str:
        return f"{type(self).__name__}(schema={self._schema!r})"
'''


def runtime_source(schema: str) -> str:
    """The text of _schema.py (after the header) for the default ``schema``."""
    return RUNTIME.replace("@SCHEMA@", schema.upper()).replace("@schema@", schema)


@functools.cache
def runtime(schema: str) -> dict[str, Any]:
    """The namespace of _schema.py for ``schema``: the very code the generated package runs."""
    namespace: dict[str, Any] = {"__name__": "_schema"}
    exec(compile(runtime_source(schema), "_schema.py", "exec"), namespace)  # noqa: S102
    return namespace


def emit_models(request: dict[str, Any], ctx: Context) -> str:
    mod = Module()
    enums = list(ctx.enums.values())
    if enums:
        mod.need("enum")
    for e in enums:
        mod.add("", "", f"class {e.class_name}(enum.StrEnum):")
        mod.add(f'    """PostgreSQL enum {e.schema}.{e.name}."""', "")
        for member, label in zip(e.members, e.labels, strict=True):
            mod.add(f"    {member} = {json.dumps(label, ensure_ascii=False)}")
        if not e.labels:
            mod.add("    pass")
    for t in ctx.tables.values():
        emit_dataclass(mod, t.class_name, t.fields, f"A row of {t.schema}.{t.name}.")
    if ctx.needs_enum_array_parser:
        mod.need("re")
        mod.need("enum")
        mod.need("typing", "Any")
        mod.need("typing", "TypeVar")
        mod.add(*ENUM_ARRAY_PARSER.split("\n"))
    schema = ", ".join((request.get("settings") or {}).get("schema") or []) or "the schema"
    return mod.render(header(request, schema), "Enums and table rows of the schema.")


def query_source(request: dict[str, Any], filename: str) -> str:
    entries: list[str] = (request.get("settings") or {}).get("queries") or []
    files = [e for e in entries if e.endswith(".sql")]
    for e in files:
        if e.rsplit("/", 1)[-1] == filename:
            return e
    dirs = [e for e in entries if not e.endswith(".sql")]
    if len(dirs) == 1:
        return dirs[0].rstrip("/") + "/" + filename
    return filename


def module_name(filename: str) -> str:
    base = filename.rsplit("/", 1)[-1]
    base = base[: -len(".sql")] if base.lower().endswith(".sql") else base
    name = identifier(base, "queries")
    if name in ("models", "__init__"):
        raise PluginError(f"query file {filename!r} would overwrite the generated {name}.py")
    if name == ASYNC_PACKAGE:
        raise PluginError(
            f"query file {filename!r} would clash with the generated package {name}/ "
            "(the asyncio queries); rename it"
        )
    return name


def generate(request: dict[str, Any]) -> dict[str, str]:
    """The files (name -> text) for a GenerateRequest."""
    options = parse_options(request.get("plugin_options"))
    package = options.get("package")
    if not isinstance(package, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", package):
        raise PluginError(
            "plugin option 'package' (the dotted import name of the out directory) is "
            "required, e.g. options: {package: jobrun.postgres.sqlc}"
        )
    schema = options.get("schema")
    if schema is not None and (
        not isinstance(schema, str)
        or not _SCHEMA_OPTION.fullmatch(schema)
        or schema.startswith("pg_")
    ):
        raise PluginError(
            f"plugin option 'schema' {schema!r} is not a plain lower-case identifier "
            "([a-z_][a-z0-9_]*, at most 63 characters, not starting with pg_)"
        )
    ctx = Context(request, schema)
    queries, errors = build_queries(request, ctx)

    by_file: dict[str, list[Query]] = {}
    for q in queries:
        by_file.setdefault(q.filename, []).append(q)
    files: dict[str, str] = {}
    modules: dict[str, str] = {}
    # Method name -> the query defining it: the package's Queries class
    # inherits every module's, and the base's attributes are taken.
    methods: dict[str, str] = {name: "QueriesBase" for name in _BASE_ATTRIBUTES}
    for filename in sorted(by_file):
        try:
            name = module_name(filename)
            if name in modules:
                raise PluginError(
                    f"query files {modules[name]!r} and {filename!r} both map to {name}.py"
                )
            modules[name] = filename
            for q in by_file[filename]:
                method = snake(q.name)
                what = f"query {q.name!r} ({filename})"
                if method in methods:
                    raise PluginError(
                        f"{what} and {methods[method]} both make the method Queries.{method}()"
                    )
                methods[method] = what
            files[f"{name}.py"] = emit_query_module(
                request, ctx, package, filename, by_file[filename]
            )
            files[f"{ASYNC_PACKAGE}/{name}.py"] = emit_async_query_module(
                request, ctx, package, name, filename, by_file[filename]
            )
        except PluginError as exc:
            errors.append(str(exc))
    if errors:
        raise PluginError("\n".join(errors))
    files["models.py"] = emit_models(request, ctx)
    queries_src = ", ".join((request.get("settings") or {}).get("queries") or []) or "queries"
    files["_schema.py"] = (
        "\n".join(header(request, queries_src)) + "\n" + runtime_source(ctx.schema)
    )
    files["__init__.py"] = emit_init(request, package, queries_src, sorted(modules))
    files[f"{ASYNC_PACKAGE}/__init__.py"] = emit_async_init(
        request, package, queries_src, sorted(modules)
    )
    return dict(sorted(files.items()))


# The subpackage of the asyncio twins: aio/<module>.py and aio/__init__.py.
ASYNC_PACKAGE = "aio"

# What QueriesBase defines for the generated methods' use: no query may take these names.
_BASE_ATTRIBUTES = ("schema", "sql")


def emit_init(request: dict[str, Any], package: str, source: str, modules: list[str]) -> str:
    init = Module()
    for name in modules:
        init.need(package, name)
    init.need(f"{package}._schema", "DEFAULT_SCHEMA")
    bases = call("class Queries", [f"{name}.Queries" for name in modules])
    init.add(
        "",
        "",
        '__all__ = ["DEFAULT_SCHEMA", "Queries"]',
        "",
        "",
        *layout(bases, "", suffix=":"),
        f'    """Every query of {source}, run in one PostgreSQL schema.',
        "",
        "    ``Queries()`` runs them in DEFAULT_SCHEMA, with the SQL as written;",
        '    ``Queries(schema="myapp_jobs")`` in that schema (a ValueError when the',
        "    name is not a plain lower-case identifier). _schema.py tells how the SQL",
        "    is rewritten for another schema. Each method takes the connection first,",
        "    then its parameters by keyword (or the rows of a :copyfrom or :batch*).",
        '    """',
        "",
        "    __slots__ = ()",
    )
    return init.render(
        header(request, source), f"Typed psycopg 3 queries ({package}), generated by sqlc."
    )


def emit_query_module(
    request: dict[str, Any], ctx: Context, package: str, filename: str, queries: list[Query]
) -> str:
    mod = Module()
    enum_import: set[str] = set()
    model_import: set[str] = set()
    names: dict[str, str] = {"Queries": "the Queries class", "QueriesBase": "its base"}
    methods: list[str] = []

    def claim(name: str, what: str) -> None:
        if name in names:
            raise PluginError(f"{what} and {names[name]} both generate the name {name!r}")
        names[name] = what

    model_names = {t.class_name for t in ctx.tables.values()} | {
        e.class_name for e in ctx.enums.values()
    }
    for q in queries:
        what = f"query {q.name!r} ({filename})"
        const = snake(q.name).upper()
        claim(const, what)
        if q.cmd == ":copyfrom":
            claim(f"{const}_COPY", what)
            claim(f"{const}_COPY_TYPES", what)
        cap = q.name[:1].upper() + q.name[1:]
        for cls in (f"{cap}Row", f"{cap}Params"):
            if cls in model_names:
                raise PluginError(f"{what}: class {cls!r} clashes with a model in models.py")
            claim(cls, what)
        emit_query(mod, methods, q, enum_import, model_import)
    imported = sorted(enum_import | model_import)
    for name in imported:
        mod.need(f"{package}.models", name)
    mod.need(f"{package}._schema", "QueriesBase")
    source = query_source(request, filename)
    mod.add(
        "",
        "",
        "class Queries(QueriesBase):",
        *docstring_lines(
            [f"The queries of {source}, run in the schema given (see QueriesBase)."], "    "
        ),
        "",
        "    __slots__ = ()",
        *methods,
    )
    return mod.render(header(request, source), f"Queries of {source}.")


def emit_async_query_module(
    request: dict[str, Any],
    ctx: Context,
    package: str,
    module: str,
    filename: str,
    queries: list[Query],
) -> str:
    """``aio/<module>.py``: the AsyncQueries class of one query file.

    Its methods are the sync module's, awaited: the SQL constants and the
    Row / Params dataclasses are imported from ``<package>.<module>``, never
    written twice. emit_query_module has checked the names already.
    """
    mod = Module()
    enum_import: set[str] = set()
    model_import: set[str] = set()
    shared: set[str] = set()
    methods: list[str] = []
    for q in queries:
        emit_query(mod, methods, q, enum_import, model_import, ASYNC, shared)
    for name in sorted(enum_import | model_import):
        mod.need(f"{package}.models", name)
    for name in sorted(shared):
        mod.need(f"{package}.{module}", name)
    mod.need(f"{package}._schema", "QueriesBase")
    source = query_source(request, filename)
    mod.add(
        "",
        "",
        "class AsyncQueries(QueriesBase):",
        *docstring_lines(
            [
                f"The queries of {source} for asyncio, run in the schema given.",
                "",
                f"Each method is the coroutine twin of {package}.{module}.Queries':",
                "the same statement and result, on a psycopg.AsyncConnection.",
            ],
            "    ",
        ),
        "",
        "    __slots__ = ()",
        *methods,
    )
    return mod.render(header(request, source), f"Asyncio queries of {source}.")


def emit_async_init(request: dict[str, Any], package: str, source: str, modules: list[str]) -> str:
    """``aio/__init__.py``: AsyncQueries, inheriting every ``aio`` module's."""
    init = Module()
    for name in modules:
        init.need(f"{package}.{ASYNC_PACKAGE}", name)
    init.need(f"{package}._schema", "DEFAULT_SCHEMA")
    bases = call("class AsyncQueries", [f"{name}.AsyncQueries" for name in modules])
    init.add(
        "",
        "",
        '__all__ = ["DEFAULT_SCHEMA", "AsyncQueries"]',
        "",
        "",
        *layout(bases, "", suffix=":"),
        f'    """Every query of {source} for asyncio, run in one PostgreSQL schema.',
        "",
        f"    The twin of {package}.Queries: the same SQL, parameters and rows,",
        "    each method a coroutine on a ``psycopg.AsyncConnection`` (a :copyfrom",
        "    writes through ``async with cur.copy(...)``). ``AsyncQueries()`` runs",
        '    them in DEFAULT_SCHEMA, ``AsyncQueries(schema="myapp_jobs")`` in that',
        "    schema, rewritten as _schema.py tells.",
        '    """',
        "",
        "    __slots__ = ()",
    )
    return init.render(
        header(request, source),
        f"Typed psycopg 3 asyncio queries ({package}.{ASYNC_PACKAGE}), generated by sqlc.",
    )


def run(stdin: bytes) -> bytes:
    """GenerateRequest JSON in, GenerateResponse JSON out."""
    try:
        request = json.loads(stdin)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise PluginError(
            f"the request on stdin is not JSON ({exc}); set `format: json` under the "
            "plugin's `process:` in sqlc.yaml"
        ) from exc
    if not isinstance(request, dict):
        raise PluginError("the request on stdin is not a GenerateRequest object")
    files = generate(request)
    response = {
        "files": [
            {"name": name, "contents": base64.b64encode(text.encode()).decode()}
            for name, text in files.items()
        ]
    }
    return json.dumps(response).encode()


def main() -> int:
    try:
        sys.stdout.buffer.write(run(sys.stdin.buffer.read()))
    except PluginError as exc:
        for line in str(exc).splitlines():
            print(f"{GENERATOR}: {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
