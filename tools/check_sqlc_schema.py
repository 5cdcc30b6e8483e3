#!/usr/bin/env python3
"""Check that sqlc.yaml's `schema:` list is exactly the forward migrations.

sqlc must read db/migrations/NNNN.name.sql in order and never yoyo's
*.rollback.sql files, so sqlc.yaml lists the forward migrations one by one
rather than with a glob. This script fails (exit 1) when that list and the
directory disagree: a migration added but not listed, a listed file gone, or
the order differs.

Usage: tools/check_sqlc_schema.py [--root REPO]    (stdlib only)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

MIGRATIONS = "db/migrations"
FORWARD = re.compile(r"^\d{4}\.[^/]+\.sql$")


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _strip_comment(line: str) -> str:
    # Enough YAML for this file: a `#` after whitespace (or at the start)
    # begins a comment; paths here contain no quotes with `#` inside.
    return re.sub(r"(^|\s)#.*$", "", line).rstrip()


def schema_lists(config_text: str) -> list[list[str]]:
    """Every `schema:` value in a sqlc.yaml, each as a list of paths.

    Understands the three spellings sqlc.yaml uses: a block list
    (`schema:` then `- path` lines), a flow list (`schema: [a, b]`) and a
    single path (`schema: path`). A codegen entry's `options:` mapping is
    skipped: the psycopg plugin has an option named `schema` too.
    """
    lines = [_strip_comment(line) for line in config_text.splitlines()]
    found: list[list[str]] = []
    i = 0
    while i < len(lines):
        options = re.match(r"^\s*(?:-\s+)?(options)\s*:\s*$", lines[i])
        m = re.match(r"^\s*(?:-\s+)?(schema)\s*:\s*(.*)$", lines[i])
        i += 1
        if options is not None:
            while i < len(lines) and (
                not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > options.start(1)
            ):
                i += 1
            continue
        if m is None:
            continue
        rest = m.group(2).strip()
        if rest.startswith("["):
            if not rest.endswith("]"):
                raise ValueError("sqlc.yaml: a multi-line flow list under schema: is not supported")
            found.append([_unquote(v) for v in rest[1:-1].split(",") if v.strip()])
        elif rest:
            found.append([_unquote(rest)])
        else:
            items: list[str] = []
            key_indent = m.start(1)
            while i < len(lines):
                line = lines[i]
                if not line.strip():
                    i += 1
                    continue
                item = re.match(r"^(\s*)-\s+(.*)$", line)
                if item is None or len(item.group(1)) < key_indent:
                    break
                items.append(_unquote(item.group(2)))
                i += 1
            found.append(items)
    return found


def forward_migrations(root: Path) -> tuple[list[str], list[str]]:
    """The forward migrations in order, and the names that break the convention."""
    directory = root / MIGRATIONS
    forward: list[str] = []
    odd: list[str] = []
    for path in sorted(directory.iterdir()):
        name = path.name
        if not path.is_file() or not name.endswith(".sql") or name.endswith(".rollback.sql"):
            continue
        (forward if FORWARD.match(name) else odd).append(f"{MIGRATIONS}/{name}")
    return forward, odd


def check(root: Path) -> list[str]:
    """Problems found, empty when sqlc.yaml and db/migrations agree."""
    config = root / "sqlc.yaml"
    if not config.is_file():
        return [f"{config} not found"]
    if not (root / MIGRATIONS).is_dir():
        return [f"{root / MIGRATIONS} not found"]
    try:
        lists = schema_lists(config.read_text(encoding="utf-8"))
    except ValueError as exc:
        return [str(exc)]
    expected, odd = forward_migrations(root)
    problems = [
        f"{name}: not named NNNN.name.sql (or NNNN.name.rollback.sql); yoyo and "
        "sqlc.yaml expect that convention"
        for name in odd
    ]
    if not lists:
        problems.append("sqlc.yaml: no `schema:` list found")
    for listed in lists:
        normalized = [p.removeprefix("./") for p in listed]
        if normalized == expected:
            continue
        missing = [p for p in expected if p not in normalized]
        extra = [p for p in normalized if p not in expected]
        lines = ["sqlc.yaml: `schema:` does not list the forward migrations of db/migrations/"]
        if missing:
            lines.append("  missing from sqlc.yaml: " + ", ".join(missing))
        if extra:
            lines.append("  listed but not a forward migration: " + ", ".join(extra))
        if not missing and not extra:
            lines.append("  wrong order")
        lines.append("  sqlc.yaml has:  " + (", ".join(normalized) or "(nothing)"))
        lines.append("  expected:       " + (", ".join(expected) or "(nothing)"))
        lines.append("  fix: list them in order under `schema:` in sqlc.yaml, e.g.")
        lines.extend(f"      - {p}" for p in expected)
        problems.append("\n".join(lines))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the repository root (default: the parent of tools/)",
    )
    args = parser.parse_args(argv)
    problems = check(args.root)
    for problem in problems:
        print(f"check_sqlc_schema: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
