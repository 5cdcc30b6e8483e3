"""The wheel carries the dashboard whole: its templates and static files, not only Python."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "jobrun" / "web"


def test_the_wheel_carries_every_template_and_static_file(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("jobrun-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = sorted(
        p.relative_to(ROOT).as_posix()
        for folder in ("templates", "static")
        for p in (WEB / folder).rglob("*")
        if p.is_file()
    )
    assert len(shipped) >= 12
    missing = [name for name in shipped if name not in names]
    assert missing == []
    assert "jobrun/web/app.py" in names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Provides-Extra: web" in text
    assert any(
        line.startswith("Requires-Dist: starlette") and "extra == 'web'" in line
        for line in text.splitlines()
    ), text
