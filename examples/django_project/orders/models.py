from django.db import models


class Order(models.Model):
    number = models.IntegerField(unique=True)
    cents = models.IntegerField()


class Invoice(models.Model):
    order = models.OneToOneField(Order, on_delete=models.CASCADE)  # one per order, ever
    cents = models.IntegerField()
