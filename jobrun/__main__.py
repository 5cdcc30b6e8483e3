"""``python -m jobrun``: the ``jobrun`` command (see :mod:`jobrun.cli`)."""

from __future__ import annotations

import sys

from jobrun.cli import main

if __name__ == "__main__":
    sys.exit(main())
