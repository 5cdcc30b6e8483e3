"""The test project's Django tasks (run by ``manage.py jobrun_worker`` in a subprocess)."""

try:
    from django.tasks import task
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task

from jrtest_shop.models import Order


class Declined(Exception):
    pass


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails", priority=10)
def send_receipt(to: str, *, order: int) -> dict:
    return {"sent_to": to, "order": order}


@task()
def charge(order: int) -> None:
    raise Declined(f"card declined for order {order}")


@task(takes_context=True)
def which_attempt(context) -> int:  # a TaskContext
    return context.attempt


@task()
def record_order(number: int, cents: int) -> int:
    """Writes through the ORM from the worker: Django is set up there."""
    return Order.objects.create(number=number, cents=cents).pk
