"""A minimal Django project for the tests: one app, jobrun's task backend, PostgreSQL.

The database comes from ``JRTEST_DATABASE_URL`` (a libpq string or URL): the
in-process tests point it at each test's database themselves, and a
``manage.py`` subprocess gets it in its environment. ``admin`` is the same
database as the superuser (``JRTEST_ADMIN_DATABASE_URL``), for creating the
model's table when the suite runs as the DML-only runtime role.
"""

import os

from psycopg.conninfo import conninfo_to_dict


def database(url: str) -> dict[str, str]:
    params = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": str(params.get("dbname", "")),
        "USER": str(params.get("user", "")),
        "PASSWORD": str(params.get("password", "")),
        "HOST": str(params.get("host", "")),
        "PORT": str(params.get("port", "")),
    }


_URL = os.environ.get("JRTEST_DATABASE_URL", "dbname=jrtest_unset")
DATABASES = {
    "default": database(_URL),
    "admin": database(os.environ.get("JRTEST_ADMIN_DATABASE_URL", _URL)),
}
INSTALLED_APPS = ["jobrun.contrib.django", "jrtest_shop"]
TASKS = {
    "default": {
        "BACKEND": "jobrun.contrib.django.JobrunBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "max_attempts": 2,
            "backoff": {"kind": "constant", "base": 0.0, "jitter": 0.0},
        },
    },
}
SECRET_KEY = "only-for-the-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
