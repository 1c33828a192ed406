"""The chaos project's own data: an order, written in the same transaction as its task."""

from django.db import models


class Order(models.Model):
    key = models.CharField(max_length=64, unique=True)
