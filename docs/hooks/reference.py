"""MkDocs hook: the CLI and settings references, generated from the code at build time.

A page holding ``<!-- generated: cli -->`` gets every ``jobrun`` command's
help, as argparse prints it from :func:`jobrun.cli.entry.build_parser`; one
holding ``<!-- generated: settings -->`` gets a table of every
:class:`jobrun.Settings` field with its environment variable, its flag, its
default and the flag's help. Neither is ever a hand copy, so neither can
drift from the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_DEFAULT_SUFFIX = re.compile(r"\s*\(default: ([^;]*); env ([A-Z_]+)\)\s*$")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "<!-- generated: cli -->" in markdown:
        markdown = markdown.replace("<!-- generated: cli -->", cli_reference())
    if "<!-- generated: settings -->" in markdown:
        markdown = markdown.replace("<!-- generated: settings -->", settings_reference())
    return markdown


def _parser() -> argparse.ArgumentParser:
    from jobrun.cli.entry import build_parser  # noqa: PLC0415 - the repository's, at build time

    return build_parser()


def _commands(
    parser: argparse.ArgumentParser,
) -> Iterator[argparse.ArgumentParser]:
    """The parser and every subcommand's, depth first, in the order they were added."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub in action.choices.values():
                if id(sub) not in seen:  # aliases share a parser
                    seen.add(id(sub))
                    yield from _commands(sub)


def cli_reference() -> str:
    saved = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR")}
    os.environ.update(COLUMNS="100", NO_COLOR="1")  # the same text whatever the terminal
    try:
        parts = []
        for p in _commands(_parser()):
            level = "##" if p.prog.count(" ") <= 1 else "###"
            parts.append(f"{level} `{p.prog}`\n\n```text\n{p.format_help().rstrip()}\n```\n")
        return "\n".join(parts)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _flags() -> dict[str, tuple[str, str, str | None]]:
    """Each environment variable's flag, help and default as the flag's help words them."""
    found: dict[str, tuple[str, str, str | None]] = {}
    for p in _commands(_parser()):
        for action in p._actions:
            m = _DEFAULT_SUFFIX.search(action.help or "")
            if action.option_strings and m and m.group(2) not in found:
                help_text = _DEFAULT_SUFFIX.sub("", action.help or "")
                found[m.group(2)] = (max(action.option_strings, key=len), help_text, m.group(1))
    return found


def settings_reference() -> str:
    from jobrun import config  # noqa: PLC0415 - the repository's, at build time
    from jobrun.cli.parser import _shown  # noqa: PLC0415 - a default as the CLI words it

    env = {field: var for var, (field, _parse) in config._ENV.items()}
    flags = _flags()
    defaults = config.Settings()
    rows = [
        "| field | environment | flag | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for field in dataclasses.fields(config.Settings):
        flag, help_text, worded = flags.get(env.get(field.name, ""), ("", "", None))
        default = worded or _shown(getattr(defaults, field.name))
        cells = [
            f"`{field.name}`",
            f"`{env[field.name]}`" if field.name in env else "",
            f"`{flag}`" if flag else "",
            f"`{default}`" if " " not in default else default,
            help_text.replace("|", "\\|").replace("\n", " "),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    old = ", ".join(f"`{o}` (now `{n}`)" for o, n in config.DEPRECATED_ENV.items())
    return "\n".join(rows) + f"\n\nOlder names still read, with one warning each: {old}.\n"
