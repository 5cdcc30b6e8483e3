"""The project's tasks: plain Django tasks, run by ``python manage.py jobrun_worker``."""

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2: the django-tasks backport

from orders.models import Invoice, Order


@task()
def send_invoice(number: int) -> dict:
    # The job exists only because the order's transaction committed: the order is there.
    order = Order.objects.get(number=number)
    # A task runs at least once: get_or_create keeps a second run from a second invoice.
    invoice, _ = Invoice.objects.get_or_create(order=order, defaults={"cents": order.cents})
    return {"invoice": invoice.pk, "cents": invoice.cents}
