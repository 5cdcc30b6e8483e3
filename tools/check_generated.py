#!/usr/bin/env python3
"""Fail when jobrun/postgres/sqlc/ is not what `sqlc generate` makes now.

Copies sqlc.yaml, db/ and tools/ into a temporary directory, runs sqlc there
(the `sqlc` next to this Python, i.e. the same virtualenv), and compares the
fresh output with the committed jobrun/postgres/sqlc/: a file that differs, a
file missing, or a stale file that sqlc no longer writes (sqlc never deletes
files; `make generate` starts from an empty directory) are all failures. Prints
a short diff per file. Exit 0 when fresh, 1 when not, 2 when sqlc cannot run.

Usage: tools/check_generated.py [--root REPO]    (stdlib only)
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

GENERATED = "jobrun/postgres/sqlc"
INPUTS = ("sqlc.yaml", "db", "tools")
MAX_DIFF_LINES = 40


def _files(directory: Path) -> dict[str, Path]:
    """Relative path -> file, without Python's caches."""
    if not directory.is_dir():
        return {}
    return {
        p.relative_to(directory).as_posix(): p
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def generate(root: Path, workdir: Path) -> Path:
    """Run sqlc on a copy of the inputs; return the fresh output directory."""
    for name in INPUTS:
        source = root / name
        if source.is_dir():
            shutil.copytree(
                source, workdir / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        elif source.is_file():
            shutil.copy2(source, workdir / name)
    sqlc = Path(sys.executable).parent / "sqlc"
    if not sqlc.exists():
        raise RuntimeError(
            f"{sqlc} not found: install the dev dependencies (pip install -e '.[dev]')"
        )
    env = dict(os.environ)
    # Like `make generate`: the plugin's `#!/usr/bin/env python3` finds this
    # virtualenv's Python (sqlc.yaml passes PATH through to the plugin).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        [str(sqlc), "generate"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sqlc generate failed:\n{proc.stdout}{proc.stderr}".rstrip())
    return workdir / GENERATED


def compare(committed: Path, fresh: Path) -> list[str]:
    """Human-readable differences; empty when the directories match."""
    have, want = _files(committed), _files(fresh)
    report: list[str] = []
    for name in sorted(want.keys() - have.keys()):
        report.append(f"missing: {GENERATED}/{name} (sqlc generates it)")
    for name in sorted(have.keys() - want.keys()):
        report.append(f"stale:   {GENERATED}/{name} (sqlc no longer generates it)")
    for name in sorted(have.keys() & want.keys()):
        old = have[name].read_text(encoding="utf-8", errors="replace")
        new = want[name].read_text(encoding="utf-8", errors="replace")
        if old == new:
            continue
        diff = list(
            difflib.unified_diff(
                old.splitlines(),
                new.splitlines(),
                f"{GENERATED}/{name} (committed)",
                f"{GENERATED}/{name} (fresh)",
                lineterm="",
            )
        )
        changed = sum(1 for line in diff[2:] if line[:1] in "+-")
        report.append(f"differs: {GENERATED}/{name} ({changed} lines changed)")
        report.extend("    " + line for line in diff[:MAX_DIFF_LINES])
        if len(diff) > MAX_DIFF_LINES:
            report.append(f"    ... {len(diff) - MAX_DIFF_LINES} more diff lines")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the repository root (default: the parent of tools/)",
    )
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    with tempfile.TemporaryDirectory(prefix="jobrun-check-generated-") as tmp:
        try:
            fresh = generate(root, Path(tmp))
        except RuntimeError as exc:
            print(f"check_generated: {exc}", file=sys.stderr)
            return 2
        report = compare(root / GENERATED, fresh)
    if report:
        print(f"check_generated: {GENERATED}/ is out of date; run `make generate`:")
        for line in report:
            print(line)
        return 1
    print(f"check_generated: {GENERATED}/ is up to date")
    # The sync store modules generated from their asyncio source (tools/async_to_sync.py).
    if (root / "jobrun" / "postgres" / "transactions_async.py").exists():
        unasync = [sys.executable, str(Path(__file__).with_name("async_to_sync.py")), "--check"]
        if subprocess.run([*unasync, "--root", str(root)], check=False).returncode != 0:
            return 1
        print("check_generated: the sync store modules are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
