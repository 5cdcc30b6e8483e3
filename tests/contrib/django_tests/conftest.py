"""Django for these tests: the project in tests/contrib/django_project, set up once.

Django's settings cannot be reloaded, so they are configured here, when
pytest imports this file and before the test modules import the project's
models and tasks. Each test's ``django_db`` points the project's databases at
that test's own database (and creates the shop's table).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import django
import pytest
from django.conf import settings
from django.db import connections

PROJECT = Path(__file__).resolve().parents[1] / "django_project"

sys.path.insert(0, str(PROJECT))
if not settings.configured:
    import jrtest_site.settings as project

    settings.configure(**{k: getattr(project, k) for k in dir(project) if k.isupper()})
    django.setup()

from jrtest_shop.models import Order  # noqa: E402 - once Django is set up
from jrtest_site.settings import database  # noqa: E402

from jobrun.contrib.django.backend import close_clients  # noqa: E402


@pytest.fixture
def django_db(dsn: str, admin_dsn: str) -> Iterator[None]:
    """Django's databases pointed at this test's, with the shop's table created."""
    for alias, url in (("default", dsn), ("admin", admin_dsn)):
        connections[alias].close()
        connections[alias].settings_dict.update(database(url))
    with connections["admin"].schema_editor() as editor:
        editor.create_model(Order)
    try:
        yield
    finally:
        close_clients()
        connections.close_all()
