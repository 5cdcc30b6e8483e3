"""mypy --strict over the typed-task samples: correct calls are clean, each wrong one errors.

``typed_tasks_ok.py`` holds correct uses (with ``typing.assert_type`` on what
they return); ``typed_tasks_bad.py`` holds wrong ones, each line marked
``# E: code [code...]`` with the error codes mypy must report there. One mypy
run (the project's own, ``.venv/bin/python -m mypy``, strict, with a cache of
its own) checks both.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OK = HERE / "typed_tasks_ok.py"
BAD = HERE / "typed_tasks_bad.py"
_ERROR = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): error: (?P<message>.*?)(?:  \[(?P<code>[\w-]+)\])?$"
)
_MARK = re.compile(r"# E: (?P<codes>[\w -]+)$")

Errors = dict[str, dict[int, set[str]]]
"""File name -> line -> the error codes mypy reported there."""


def _python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> Errors:
    cache = tmp_path_factory.mktemp("mypy-cache")
    done = subprocess.run(
        [
            _python(),
            "-m",
            "mypy",
            "--strict",
            "--show-error-codes",
            "--no-error-summary",
            "--no-pretty",
            "--cache-dir",
            str(cache),
            str(OK),
            str(BAD),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode in (0, 1), f"mypy crashed:\n{done.stdout}\n{done.stderr}"
    errors: Errors = {OK.name: defaultdict(set), BAD.name: defaultdict(set)}
    for line in done.stdout.splitlines():
        m = _ERROR.match(line)
        if m is None:
            continue
        errors.setdefault(Path(m["path"]).name, defaultdict(set))[int(m["line"])].add(
            m["code"] or "?"
        )
    unexpected = set(errors) - {OK.name, BAD.name}
    assert not unexpected, f"errors outside the samples:\n{done.stdout}"
    return errors


def _marked(path: Path) -> dict[int, set[str]]:
    marks: dict[int, set[str]] = {}
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        m = _MARK.search(text)
        if m is not None:
            marks[number] = set(m["codes"].split())
    return marks


def test_mypy_strict_accepts_every_correct_use_of_a_typed_task(mypy_errors: Errors) -> None:
    assert dict(mypy_errors[OK.name]) == {}


def test_mypy_strict_rejects_every_wrong_call_with_the_error_marked_on_its_line(
    mypy_errors: Errors,
) -> None:
    expected = _marked(BAD)
    assert len(expected) >= 20  # the sample is whole
    assert dict(mypy_errors[BAD.name]) == expected
