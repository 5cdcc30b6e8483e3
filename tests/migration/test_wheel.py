"""A wheel built from the repo works from a plain pip install, migrations included."""

from __future__ import annotations

import subprocess
import sys
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
