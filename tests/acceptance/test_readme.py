"""The README and the documentation run as written: every code block is executed here.

Each fenced block in README.md and in every page of docs/ is preceded by an
HTML comment that says what it is, so that no block can drift from the code
unnoticed (a block without one fails the suite):

``<!-- readme: file NAME -->``
    the block is written to NAME in a fresh directory (the reader's project);
``<!-- readme: shell -->``
    each line is a command, run in that directory with ``sh`` against a
    database of the test's own (``DATABASE_URL``), in order, and must exit 0.
    A command ending with `` &`` starts in the background (a worker, say) and
    is stopped with SIGINT once the section's last command has run; it must
    then exit 0 too;
``<!-- readme: output -->``
    what the reader sees: every non-empty line must be found in what the
    section's commands printed, with ``…`` standing for anything (ids,
    times);
``<!-- readme: skip REASON -->``
    not run, and the reason says why (installing the package, which
    tests/migration/test_wheel.py does for real from a built wheel; a
    diagram; a fragment whose whole program runs elsewhere, named).

Blocks run section by section (a ``##`` heading starts a section), each in a
directory of its own that holds the files of the sections above it (a
reader's project keeps them), on an empty database (the README runs ``jobrun
migrate`` itself), with nothing on ``PYTHONPATH``. A page of docs/ starts
where the README's Quickstart left the reader: with its files (``tasks.py``).
A block lives in one place only (docs/tutorial.md includes the README's
Quickstart rather than copying it), so nothing runs twice.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)]
VENV_BIN = Path(sys.executable).parent

_MARK = re.compile(r"<!--\s*readme:\s*(file|shell|output|skip)\b\s*(.*?)\s*-->")
_FENCE = re.compile(r"^```")


@dataclasses.dataclass
class Block:
    kind: str
    arg: str
    text: str
    line: int


@dataclasses.dataclass
class Section:
    title: str
    blocks: list[Block]
    page: str = "README.md"
    earlier_files: dict[str, str] = dataclasses.field(default_factory=dict)
    """The files earlier sections wrote: the reader's project keeps them."""


def sections(
    text: str, page: str = "README.md", files: dict[str, str] | None = None
) -> list[Section]:
    """A page's sections with their annotated blocks; ValueError for an unannotated block.

    ``files`` are those the reader already has when the page starts.
    """
    found: list[Section] = [Section("(top)", [], page)]
    lines = text.splitlines()
    mark: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            found.append(Section(line[3:].strip(), [], page))
        m = _MARK.search(line)
        if m:
            mark = (m.group(1), m.group(2))
        elif _FENCE.match(line):
            start = i + 1
            j = start
            while j < len(lines) and not _FENCE.match(lines[j]):
                j += 1
            if mark is None:
                raise ValueError(f"{page}:{i + 1}: a code block without a <!-- readme: ... -->")
            found[-1].blocks.append(Block(mark[0], mark[1], "\n".join(lines[start:j]), i + 1))
            mark = None
            i = j
        elif line.strip():
            mark = None if not line.lstrip().startswith("<!--") else mark
        i += 1
    files = dict(files or {})
    for section in found:
        section.earlier_files = dict(files)
        files.update((b.arg, b.text) for b in section.blocks if b.kind == "file")
    return [s for s in found if s.blocks]


def every_section() -> list[Section]:
    """The README's sections, then each docs/ page's, starting from the Quickstart's files."""
    readme = sections(README.read_text())
    quickstart = {b.arg: b.text for s in readme for b in s.blocks if b.kind == "file"}
    found = list(readme)
    for path in PAGES[1:]:
        found += sections(path.read_text(), str(path.relative_to(ROOT)), quickstart)
    return found


def runnable() -> list[Section]:
    return [s for s in every_section() if any(b.kind == "shell" for b in s.blocks)]


def _id(section: Section) -> str:
    return section.title if section.page == "README.md" else f"{section.page}: {section.title}"


def test_every_code_block_in_the_readme_and_the_docs_says_how_it_is_tested() -> None:
    all_blocks = [(s.page, b) for s in every_section() for b in s.blocks]
    assert {page for page, _ in all_blocks} >= {"README.md", "docs/handlers.md"}
    for page, block in all_blocks:
        if block.kind == "skip":
            assert block.arg, f"{page}:{block.line}: a skipped block must say why"


def test_a_code_block_without_its_comment_is_refused() -> None:
    with pytest.raises(ValueError, match=r"docs/x.md:3: a code block without"):
        sections("# X\n\n```sh\nls\n```\n", "docs/x.md")


def test_no_file_is_written_by_two_blocks_so_nothing_runs_twice() -> None:
    seen: dict[str, str] = {}
    for section in every_section():
        for block in section.blocks:
            if block.kind in ("file", "shell") and block.text.count("\n") > 2:
                where = f"{section.page}:{block.line}"
                assert block.text not in seen, f"{where} repeats {seen.get(block.text)}"
                seen[block.text] = where


def _pattern(expected: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in expected.strip().split("…")]
    return re.compile(".*".join(parts))


@pytest.mark.slow
@pytest.mark.parametrize("section", runnable(), ids=_id)
def test_the_section_runs_as_written(section: Section, empty_dsn: str, tmp_path: Path) -> None:
    dsn = empty_dsn  # not migrated: the README's own `jobrun migrate` does that
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        "JOBRUN_POLL_INTERVAL": "200ms",
        "COLUMNS": "100",
    }
    for unset in ("JOBRUN_SCHEMA", "PYTHONPATH"):  # the reader's shell has neither
        env.pop(unset, None)
    printed: list[str] = []
    background: list[Background] = []
    try:
        for name, text in section.earlier_files.items():
            _write(tmp_path / name, text)
        for block in section.blocks:
            if block.kind == "file":
                _write(tmp_path / block.arg, block.text)
            elif block.kind == "shell":
                for command in _commands(block.text):
                    if command.endswith("&"):
                        background.append(_start(command[:-1].strip(), tmp_path, env))
                        continue
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
                        f"{section.page}:{block.line}: `{command}` exited {done.returncode}\n"
                        f"{done.stdout}\n{done.stderr}"
                    )
            elif block.kind == "output":
                _expect(section.page, block, printed, background)
    finally:
        for job in background:
            job.stop()
    shutil.rmtree(tmp_path, ignore_errors=True)


def _write(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")


def _commands(text: str) -> list[str]:
    out = []
    for raw in text.splitlines():
        command = re.sub(r"\s+#.*$", "", raw).strip()
        if command and not command.startswith("#"):
            out.append(command)
    return out


def _start(command: str, cwd: Path, env: dict[str, str]) -> Background:
    log = cwd / f".background-{len(list(cwd.glob('.background-*')))}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["sh", "-c", f"exec {command}"],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return Background(command, proc, log)


@dataclasses.dataclass
class Background:
    command: str
    proc: subprocess.Popen[str]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        assert code in (0, 130), f"`{self.command}` exited {code} when stopped:\n{self.output()}"


def _expect(page: str, block: Block, printed: list[str], background: list[Background]) -> None:
    """Every line of the block is printed by now (background output may lag: wait a bit)."""
    deadline = time.monotonic() + 30
    missing: list[str] = []
    while True:
        seen = "\n".join([*printed, *(b.output() for b in background)]).splitlines()
        missing = [
            line.strip()
            for line in block.text.splitlines()
            if line.strip() and not any(_pattern(line).search(out) for out in seen)
        ]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not missing, (
        f"{page}:{block.line}: the reader would not see {missing}; they would see:\n"
        + "\n".join(seen)
    )
