"""docs/testing.md runs as written, in the README's way (tests/acceptance/test_readme.py).

The page's blocks carry the README's ``<!-- readme: ... -->`` markers
(file, shell, output, skip); each ``##`` section runs in a directory of its
own holding the files of the sections above it, on an empty database named
by ``DATABASE_URL``, as a reader's shell would run it. Its pytest runs use
the plugin as a reader gets it: through the installed entry point, or, in a
checkout whose installed metadata predates the entry point, ``-p``.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
VENV_BIN = Path(sys.executable).parent

_MARK = re.compile(r"<!--\s*readme:\s*(file|shell|output|skip)\b\s*(.*?)\s*-->")


def _sections() -> list[tuple[str, list[tuple[str, str, str, int]]]]:
    """(title, [(kind, arg, text, line)]) per ``##`` section; every block must be marked."""
    found: list[tuple[str, list[tuple[str, str, str, int]]]] = [("(top)", [])]
    lines = PAGE.read_text().splitlines()
    mark: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            found.append((line[3:].strip(), []))
        m = _MARK.search(line)
        if m:
            mark = (m.group(1), m.group(2))
        elif line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            assert mark is not None, f"docs/testing.md:{i + 1}: a block without a marker"
            found[-1][1].append((mark[0], mark[1], "\n".join(lines[i + 1 : end]), i + 1))
            mark, i = None, end
        elif line.strip():
            mark = None
        i += 1
    return [s for s in found if s[1]]


def _plugin_opts() -> str:
    installed = any(
        ep.value == "jobrun.pytest_plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )
    return "" if installed else "-p jobrun.pytest_plugin"


def test_every_block_of_the_page_is_marked_and_skips_say_why() -> None:
    blocks = [b for _, section in _sections() for b in section]
    assert any(kind == "shell" for kind, *_ in blocks)
    assert all(arg for kind, arg, *_ in blocks if kind == "skip")


@pytest.mark.slow
@pytest.mark.parametrize(
    "index",
    [n for n, (_, blocks) in enumerate(_sections()) if any(b[0] == "shell" for b in blocks)],
    ids=lambda n: _sections()[n][0],
)
def test_the_testing_page_section_runs_as_written(
    index: int, empty_dsn: str, tmp_path: Path
) -> None:
    sections = _sections()
    env = {
        **os.environ,
        "DATABASE_URL": empty_dsn,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        # This checkout's jobrun, whatever the shared environment has installed.
        "PYTHONPATH": str(ROOT),
        "PYTEST_ADDOPTS": _plugin_opts(),
    }
    env.pop("JOBRUN_SCHEMA", None)
    for _, blocks in sections[: index + 1]:
        for kind, arg, text, _line in blocks:
            if kind == "file":
                (tmp_path / arg).write_text(text + "\n")
    printed: list[str] = []
    for kind, _arg, text, line in sections[index][1]:
        if kind == "shell":
            for command in filter(None, (c.strip() for c in text.splitlines())):
                done = subprocess.run(
                    ["sh", "-c", command],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                printed.append(done.stdout + done.stderr)
                assert done.returncode == 0, (
                    f"docs/testing.md:{line}: `{command}` exited {done.returncode}\n"
                    f"{done.stdout}\n{done.stderr}"
                )
        elif kind == "output":
            seen = "\n".join(printed)
            for expected in filter(None, (x.strip() for x in text.splitlines())):
                pattern = ".*".join(re.escape(p) for p in expected.split("…"))
                assert re.search(pattern, seen), (
                    f"docs/testing.md:{line}: {expected!r} not printed; printed:\n{seen}"
                )
