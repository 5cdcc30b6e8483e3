"""docs/architecture.md names only files that exist, and maps the whole spec.

The page is a newcomer's map from a concept or a sentence of the
specification to the file that implements it, one hop. A map that points at
a file since moved or renamed is worse than none, so every repository path
it mentions is checked here: a move without its line on the page fails.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"

TOP = ("jobrun/", "db/", "tests/", "tools/", "docs/", "bench/", ".ci/")
ROOT_FILES = {"README.md", "Makefile", "pyproject.toml", "sqlc.yaml"}

# The specification's sections and the names its lists give (the Go
# postgres package's text). Each must be mapped in the page's spec map.
SPEC_SECTIONS = (
    "Overview",
    "Files",
    "Transaction boundaries",
    "The clock rule",
    "Leases and fencing",
    "Idempotency",
)
SPEC_NAMES = (
    "pool.go",
    "migrate.go",
    "store.go",
    "schedules.go",
    "events.go",
    "effects.go",
    "notify.go",
    "lock.go",
    "convert.go",
    "Enqueue",
    "EnqueueBatch",
    "Claim",
    "Complete",
    "Fail",
    "ReapExpired",
    "Cancel / Retry",
    "DueSchedules",
    "Heartbeat",
    "Purge, Depth, Get, List, Events",
)


def mentioned_paths(text: str) -> set[str]:
    """Repository paths in code spans and relative links of ``text``."""
    spans = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)#\s]+)\)", text)
    return {s for s in spans if s.startswith(TOP) or s in ROOT_FILES}


def missing(paths: set[str]) -> list[str]:
    """The paths (globs allowed) that match nothing in the repository."""
    return sorted(p for p in paths if not any(ROOT.glob(p.rstrip("/"))))


def test_every_path_on_the_page_exists() -> None:
    paths = mentioned_paths(PAGE.read_text(encoding="utf-8"))
    assert len(paths) > 50, "the page should name the files it maps"
    assert missing(paths) == []


def test_a_path_that_is_gone_is_caught() -> None:
    text = "see `jobrun/job/errors.py`, `db/query/*.sql` and `jobrun/nowhere.py`; `queued/leased`"
    paths = mentioned_paths(text)
    assert paths == {"jobrun/job/errors.py", "db/query/*.sql", "jobrun/nowhere.py"}
    assert missing(paths) == ["jobrun/nowhere.py"]


def test_the_spec_map_covers_every_section() -> None:
    text = PAGE.read_text(encoding="utf-8")
    spec_map = text.split("## Spec map", 1)[1]
    for section in SPEC_SECTIONS:
        assert f"**{section}.**" in spec_map, f"spec section {section!r} is not mapped"
    for name in SPEC_NAMES:
        rows = [line for line in spec_map.splitlines() if line.startswith(f"| {name}")]
        assert rows, f"spec item {name!r} has no row in the spec map"
        assert all(mentioned_paths(row) for row in rows), f"{name!r} maps to no file"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_anchor_on_the_page_has_its_heading() -> None:
    text = PAGE.read_text(encoding="utf-8")
    headings = {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}
    anchors = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert anchors, "the page links its own sections"
    assert anchors - headings == set()
    assert slug("The worker's threads") == "the-workers-threads"
