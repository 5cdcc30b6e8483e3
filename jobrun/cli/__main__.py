"""``python -m jobrun.cli``: the ``jobrun`` command, as the tests and process managers run it."""

from __future__ import annotations

import sys

from jobrun.cli import main

if __name__ == "__main__":
    sys.exit(main())
