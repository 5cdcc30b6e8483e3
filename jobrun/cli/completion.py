"""``jobrun completion bash|zsh``: a shell completion script, made from the parser itself.

The script is generated from the command tree that
:func:`jobrun.cli.entry.build_parser` builds (handed to :func:`register`),
when it is asked for, so it cannot drift from the commands: every command
and action, each command's options (as its help shows them), the values of
an option that has a fixed set (``--pooler``, ``--log-level``, ``--state``
...), and file names after ``--batch`` and ``--payload-file``. No
dependency, and nothing runs at completion time but the shell (argcomplete
would start Python, with jobrun's imports, on every Tab).

Install::

    jobrun completion bash > ~/.local/share/bash-completion/completions/jobrun
    jobrun completion zsh > "${fpath[1]}/_jobrun"    # or: source <(jobrun completion zsh)

zsh runs the same function through its ``bashcompinit``.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from jobrun.job.model import State

from .exits import EXIT_OK
from .parser import Commands, Parser

SHELLS = ("bash", "zsh")
FILE_OPTIONS = frozenset(("--batch", "--payload-file"))
"""Options whose value is a file name: completed from the file system."""
FREE_TEXT_VALUES = {"--state": " ".join(s.value for s in State)}
"""Values of options parsed by jobrun rather than argparse (any case is accepted)."""


def register(commands: Commands, root: argparse.ArgumentParser) -> None:
    """Add ``completion``, which describes ``root`` (the whole tree, once it is built)."""
    p = commands.add(
        "completion", cmd_completion, "print a shell completion script (bash or zsh)", json=False
    )
    p.add_argument("shell", choices=SHELLS, help="the shell: bash or zsh")
    p.set_defaults(root_parser=root)


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(script(args.root_parser, args.shell))
    return EXIT_OK


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(_walk(sub, (*path, name)))
    return found


def _shown_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    hides = parser.help_hides if isinstance(parser, Parser) else frozenset()
    return [
        a
        for a in parser._actions
        if a.option_strings and a.help != argparse.SUPPRESS and a.dest not in hides
    ]


def _words(parser: argparse.ArgumentParser) -> list[str]:
    words: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            words.extend(action.choices)
    for action in _shown_options(parser):
        words.extend(s for s in action.option_strings if s.startswith("--"))
    return words


def script(root: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``root``'s tree for ``shell`` (bash, or zsh via bashcompinit)."""
    tree = _walk(root)
    paths: list[str] = []
    takes_value: set[str] = set()
    choices: dict[str, str] = dict(FREE_TEXT_VALUES)
    word_cases: list[str] = []
    for path, parser in tree:
        key = " ".join(path)
        paths.append(key)
        word_cases.append(
            f"        {shlex.quote(key)}) words={shlex.quote(' '.join(_words(parser)))} ;;"
        )
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0:
                continue
            takes_value.update(action.option_strings)
            if action.choices:
                for flag in action.option_strings:
                    choices[flag] = " ".join(str(c) for c in action.choices)
    choice_cases = [
        f"        {shlex.quote(flag)}) words={shlex.quote(values)} ;;"
        for flag, values in sorted(choices.items())
    ]
    value_flags = "|".join(sorted(takes_value))
    file_flags = "|".join(sorted(FILE_OPTIONS))
    path_cases = "|".join(shlex.quote(p) for p in paths if p)
    header = "# jobrun completion for zsh (through bashcompinit): jobrun completion zsh\n"
    zsh = "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n"
    body = f"""_jobrun() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="" path="" word next i skip=0 words=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        if ((skip)); then skip=0; continue; fi
        case "$word" in
            -*=*) ;;
            {value_flags}) skip=1 ;;
            -*) ;;
            *)
                next="${{path:+$path }}$word"
                case "$next" in {path_cases}) path="$next" ;; esac
                ;;
        esac
    done
    ((COMP_CWORD > 1)) && prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    case "$prev" in
        {file_flags})
            COMPREPLY=($(compgen -f -- "$cur"))
            return 0
            ;;
    esac
    case "$prev" in
{chr(10).join(choice_cases)}
        {value_flags}) COMPREPLY=(); return 0 ;;
        *)
            case "$path" in
{chr(10).join(word_cases)}
            esac
            ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    return 0
}}
complete -F _jobrun jobrun
"""
    if shell == "zsh":
        return header + zsh + body
    return "# jobrun completion for bash: jobrun completion bash\n" + body
