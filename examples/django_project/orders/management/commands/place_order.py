"""``python manage.py place_order NUMBER CENTS [--decline] [--wait]``."""

import time

from django.core.management.base import BaseCommand
from django.db import transaction

from orders.models import Order
from orders.tasks import send_invoice


class Declined(Exception):
    pass


class Command(BaseCommand):
    help = "Place an order and enqueue its invoice, in one transaction."

    def add_arguments(self, parser):
        parser.add_argument("number", type=int)
        parser.add_argument("cents", type=int)
        parser.add_argument("--decline", action="store_true", help="fail after the enqueue")
        parser.add_argument("--wait", action="store_true", help="wait for the task's result")

    def handle(self, *args, number, cents, decline, wait, **options):
        try:
            with transaction.atomic():  # the order and its task commit together, or neither
                Order.objects.create(number=number, cents=cents)
                result = send_invoice.enqueue(number)
                if decline:
                    raise Declined("payment declined")
        except Declined:
            self.stdout.write(f"order {number} declined: no order, no task")
            return
        if wait:
            while not result.is_finished:
                time.sleep(0.2)
                result.refresh()
            self.stdout.write(f"order {number}: {result.status} {result.return_value}")
        else:
            self.stdout.write(f"order {number}: task {result.id}")
