"""The chaos project's requests: place an order, and enqueue its receipt in the same transaction."""

from django.db import transaction
from django.http import HttpResponse
from django.views.decorators.http import require_POST

from chaosapp.models import Order
from chaosapp.tasks import chaos_receipt, chaos_sleep


class OrderFailed(Exception):
    """Raised on request (`?fail=1`) after the task is enqueued, to roll the transaction back."""


@require_POST
def place_order(request, key):
    """Store the order `key` and enqueue `chaos_receipt(key, ms)` on commit; answer its task id."""
    with transaction.atomic():
        Order.objects.create(key=key)
        task_id = chaos_receipt.enqueue_on_commit(key, int(request.GET.get("ms", 0))).id
        _fail_if_asked(request)
    return HttpResponse(task_id, content_type="text/plain")


@require_POST
def place_order_with_django_task(request, key):
    """The same through Django's task API: `chaos_sleep.enqueue()` in the transaction (the
    backend's OUTBOX option, CHAOS_TASKS_OUTBOX=1, holds it until the commit)."""
    with transaction.atomic():
        Order.objects.create(key=key)
        task_id = chaos_sleep.enqueue(key, int(request.GET.get("ms", 0))).id
        _fail_if_asked(request)
    return HttpResponse(task_id, content_type="text/plain")


def _fail_if_asked(request):
    if request.GET.get("fail") == "1":
        raise OrderFailed(request.path)
