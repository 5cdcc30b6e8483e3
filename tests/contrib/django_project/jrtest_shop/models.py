from django.db import models


class Order(models.Model):
    number = models.IntegerField(unique=True)
    cents = models.IntegerField()

    class Meta:
        app_label = "jrtest_shop"
