#!/usr/bin/env python
"""The test project's manage.py (tests/contrib/test_django.py runs ``jobrun_worker`` with it)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jrtest_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
