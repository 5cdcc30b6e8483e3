"""The Django app: ``"jobrun.contrib.django"`` in ``INSTALLED_APPS`` gives ``jobrun_worker``."""

from __future__ import annotations

from django.apps import AppConfig  # type: ignore[import-untyped,unused-ignore]


class JobrunConfig(AppConfig):  # type: ignore[misc]  # Django ships no type hints
    name = "jobrun.contrib.django"
    label = "jobrun"
    verbose_name = "jobrun"
