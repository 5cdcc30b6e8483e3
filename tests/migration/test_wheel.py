"""A wheel built from the repo works from a plain pip install, migrations included,
and says who made it, under which license and where its home is (``pip show``)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def test_a_wheel_installed_in_a_fresh_venv_migrates_an_empty_database(
    empty_dsn: str, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("jobrun-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
    )
    script = (
        "import sys, jobrun.postgres.migrate as m\n"
        "with m.migrations_dir() as p:\n"
        "    assert 'site-packages' in str(p), p\n"
        "print(','.join(m.migrate(sys.argv[1])))\n"
    )
    out = subprocess.run(
        [str(python), "-c", script, empty_dsn],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repo: nothing may come from the source tree
    )
    applied = out.stdout.strip().split(",")
    forward = sorted(
        p.name.removesuffix(".sql")
        for p in (ROOT / "db" / "migrations").glob("*.sql")
        if not p.name.endswith(".rollback.sql")
    )
    assert applied == forward
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regclass('jobrun.jobs')::text").fetchone() == ("jobrun.jobs",)
        assert c.execute("SELECT to_regclass('public.jobs')").fetchone() == (None,)
    _assert_pip_show_is_complete(python, cwd=tmp_path)


def _assert_pip_show_is_complete(python: Path, cwd: Path) -> None:
    """What ``pip show`` tells a user of the installed wheel: every field filled in.

    The dev venv's pip (recent: it reads License-Expression and the Homepage
    Project-URL) looks into the fresh venv, whose own bundled pip may be older.
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "show", "--verbose", "jobrun"],
        check=True,
        capture_output=True,
        text=True,
        cwd=cwd,
    ).stdout
    fields: dict[str, list[str]] = {}
    for line in out.splitlines():
        name, sep, value = line.partition(":")
        if sep and not line.startswith(" "):
            fields.setdefault(name, []).append(value.strip())
    shown = {name: values[0] for name, values in fields.items()}
    assert shown["Author"] == project["authors"][0]["name"]
    assert shown["Home-page"] == project["urls"]["Homepage"]
    assert shown["License-Expression"] == "MIT"
    assert shown["Summary"] == project["description"]
    listed = out.split("Project-URLs:")[1].split("\n")
    urls = {
        label.strip(): url.strip()
        for label, _, url in (row.partition(",") for row in listed if row.startswith("  "))
    }
    for label in ("Homepage", "Documentation", "Changelog", "Issues"):
        assert urls[label] == project["urls"][label]
    classifiers = [
        row.strip() for row in out.split("Classifiers:")[1].split("\n") if row[:2] == "  "
    ]
    assert "Typing :: Typed" in classifiers
    site = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m; print(m.distribution('jobrun')"
            ".read_text('licenses/LICENSE'))",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=cwd,
    ).stdout
    assert site.startswith("MIT License")
