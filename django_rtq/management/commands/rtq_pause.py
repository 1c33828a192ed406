"""`manage.py rtq_pause QUEUE [QUEUE ...]`: stop workers from claiming from queues."""

from __future__ import annotations

from django_rtq.management.base import QueueSwitchCommand


class Command(QueueSwitchCommand):
    help = "Pause queues: workers claim nothing from them until they are resumed (running tasks finish)."

    pause = True
