"""The release files agree with each other: version, changelog, license, links.

A release bumps the version in two places and renames the changelog's
Unreleased heading (CONTRIBUTING.md, "Releasing"); a slip in either, or a
link to a page since moved, fails here rather than on PyPI.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from jobrun._version import __version__

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
PAGES = [
    "CHANGELOG.md",
    "CONTRIBUTING.md",
    "SECURITY.md",
    "docs/versioning.md",
    "docs/deploy-files.md",
]


def test_the_package_and_the_code_carry_one_version() -> None:
    assert PROJECT["version"] == __version__


def test_the_changelog_opens_with_unreleased_then_an_entry_for_this_version() -> None:
    releases = re.findall(r"^## \[([^\]]+)\](.*)$", CHANGELOG, re.MULTILINE)
    assert releases[0] == ("Unreleased", "")
    versions = [name for name, _ in releases[1:]]
    assert __version__ in versions, f"no changelog entry for {__version__}"
    for name, rest in releases[1:]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", name), name
        assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", rest), f"{name}: no ' - YYYY-MM-DD'"
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    for name, _ in releases:
        assert f"\n[{name}]: " in CHANGELOG, f"no link for [{name}]"


def test_the_changelog_uses_only_keep_a_changelogs_sections() -> None:
    used = set(re.findall(r"^### (.+)$", CHANGELOG, re.MULTILINE))
    assert used <= SECTIONS, used - SECTIONS


def test_the_license_file_is_the_license_the_metadata_names() -> None:
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_of_the_release_pages_reaches_a_file(page: str) -> None:
    path = ROOT / page
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    local = [link for link in links if "://" not in link]
    assert local or page == "CHANGELOG.md"
    for link in local:
        assert (path.parent / link).exists(), f"{page} links to {link}, which does not exist"


def test_the_sdist_carries_the_release_files_and_the_deployment_files() -> None:
    # `make check` builds the wheel from the sdist, which catches what the
    # wheel needs; these files only a reader of the sdist needs.
    hatch = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]
    included = set(hatch["build"]["targets"]["sdist"]["include"])
    assert {"LICENSE", "CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md", "deploy"} <= included
