"""Start a system's own worker command at a signal, its imports already done.

``python -m bench.peers.launch SCRIPT MODULE -- ARG...`` imports the console
script ``SCRIPT``'s function (``jobrun``, ``pgq``, ``procrastinate``: the
same function the installed command runs) and the handlers' ``MODULE``,
writes one byte to the file descriptor named by ``BENCH_PEERS_READY_FD``,
waits for a line on stdin, and then runs the command in this process with
``ARG...`` as its arguments (so signals reach the command's own handlers).

Why: the two processes of a two-process drain are started together, but
Python start-up and imports take a second or so and never end at the same
moment; with the imports paid before the signal, both workers start within
milliseconds of each other, for every system alike. The drain's rate is
measured on the database clock from the first claim anyway; this keeps the
second process from joining late.

Standard library only (it runs in both virtualenvs).
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib import metadata

READY_FD_ENV = "BENCH_PEERS_READY_FD"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[2] != "--":
        print("usage: python -m bench.peers.launch SCRIPT MODULE -- ARG...", file=sys.stderr)
        return 2
    script, module, args = argv[0], argv[1], argv[3:]
    found = metadata.entry_points(group="console_scripts", name=script)
    if not found:
        print(f"no console script {script!r} in this environment", file=sys.stderr)
        return 2
    command = next(iter(found)).load()
    importlib.import_module(module)
    ready = os.environ.get(READY_FD_ENV)
    if ready:
        fd = int(ready)
        os.write(fd, b"r")
        os.close(fd)
        if not sys.stdin.readline():
            return 1  # the orchestrator went away before the signal
    sys.argv = [script, *args]
    code = command()
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
