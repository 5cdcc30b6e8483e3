"""The clock rule: no decision in jobrun reads this host's wall clock.

Intervals (sleep, poll, heartbeat cadence) use time.monotonic; every
timestamp a decision compares comes from the database (Store.now()).
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "jobrun"
WALL_CLOCK = re.compile(r"\b(datetime\.now|datetime\.utcnow|date\.today|time\.time)\(")


def test_no_module_of_jobrun_reads_the_wall_clock() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if WALL_CLOCK.search(line) and "clock-rule: display only" not in line
    ]
    assert offenders == []
