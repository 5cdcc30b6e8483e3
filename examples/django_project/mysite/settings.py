"""A Django project whose tasks run on jobrun (see README.md beside manage.py)."""

import os

from psycopg.conninfo import conninfo_to_dict

# DATABASE_URL, as jobrun reads it (a postgresql:// URL or a key=value string).
_db = conninfo_to_dict(os.environ["DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}

INSTALLED_APPS = [
    "jobrun.contrib.django",  # python manage.py jobrun_worker
    "orders",
]

TASKS = {
    "default": {
        "BACKEND": "jobrun.contrib.django.JobrunBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"max_attempts": 5},
    }
}

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "change-me")
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
