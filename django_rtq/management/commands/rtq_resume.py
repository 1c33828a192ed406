"""`manage.py rtq_resume QUEUE [QUEUE ...]`: let workers claim from paused queues again."""

from __future__ import annotations

from django_rtq.management.base import QueueSwitchCommand


class Command(QueueSwitchCommand):
    help = "Resume paused queues: workers claim from them again."

    pause = False
