"""Models of django-rtq: the ORM mirror of finished tasks. Live task state is in Redis, not here."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class FinishedTask(models.Model):
    """A task that has left the live queue: succeeded, or failed for good (archived).

    Rows are written in batches by the worker's mirror from a buffer that the finishing
    Lua step fills, keyed by task id: writing one twice changes nothing.
    """

    class Status(models.TextChoices):
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")

    task_id = models.CharField(_("task id"), max_length=255, primary_key=True)
    task_name = models.CharField(_("task"), max_length=255)
    queue = models.CharField(_("queue"), max_length=255)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices)
    args = models.JSONField(_("arguments"), default=list)
    kwargs = models.JSONField(_("keyword arguments"), default=dict)
    priority = models.SmallIntegerField(_("priority"), default=0)
    return_value = models.JSONField(_("return value"), null=True, blank=True)
    error_class = models.CharField(_("error class"), max_length=255, blank=True)
    error_message = models.TextField(_("error message"), blank=True)
    traceback = models.TextField(_("traceback"), blank=True)
    # every attempt's error, oldest first: [{"type", "message", "traceback"}, ...]
    errors = models.JSONField(_("errors"), default=list, blank=True)
    attempts = models.PositiveIntegerField(_("attempts"), default=1)
    worker = models.CharField(_("worker"), max_length=255, blank=True)  # of the last attempt
    workers = models.JSONField(_("workers"), default=list, blank=True)  # one per attempt
    enqueued_at = models.DateTimeField(_("enqueued at"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"))
    duration = models.DurationField(_("duration"), null=True, blank=True)
    parent_id = models.CharField(_("parent id"), max_length=255, blank=True, db_index=True)

    class Meta:
        verbose_name = _("finished task")
        verbose_name_plural = _("finished tasks")
        ordering = ["-finished_at"]
        indexes = [
            models.Index(fields=["-finished_at"], name="rtq_finished_at"),
            models.Index(fields=["status", "-finished_at"], name="rtq_finished_status"),
            models.Index(fields=["queue", "-finished_at"], name="rtq_finished_queue"),
            models.Index(fields=["task_name", "-finished_at"], name="rtq_finished_task"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} {self.task_id} ({self.status})"

    @property
    def succeeded(self) -> bool:
        return self.status == self.Status.SUCCEEDED


class LiveTask(models.Model):
    """No table: the admin's live views over Redis hang on it, and its permissions guard them.

    "view" lets staff look at queues, workers and tasks; "change" lets them act (run now,
    archive, delete, cancel, pause and resume); "enqueue_task" lets API clients enqueue exposed
    task types; "edit_task_arguments" lets staff edit a failed or archived task's arguments
    and run it again. See `django_rtq.permissions`.
    """

    class Meta:
        managed = False
        default_permissions = ("view", "change")
        permissions = [
            ("enqueue_task", _("Can enqueue tasks through the API")),
            ("edit_task_arguments", _("Can edit a task's arguments and run it again")),
        ]
        verbose_name = _("live task")
        verbose_name_plural = _("live tasks")


class OutboxTask(models.Model):
    """A task waiting to be sent to Redis: stored in the transaction that enqueued it, so it
    commits or rolls back with the caller's own writes (see `django_rtq.outbox`).

    The row is deleted once its task is in Redis: by the process that committed, at once, or
    by a worker's relay if that send failed. Sending a row twice never makes a second task.
    """

    task_id = models.CharField(_("task id"), max_length=255, db_index=True)
    task_name = models.CharField(_("task"), max_length=255)
    queue = models.CharField(_("queue"), max_length=255)
    message = models.TextField(_("message"))  # the message's JSON, as Redis stores it
    created_at = models.DateTimeField(_("created at"))
    # A relay leaves the row alone until then: when it becomes the relay's to send, while a
    # relay sends it (a lease), or before the next try after an error.
    next_attempt_at = models.DateTimeField(_("next attempt at"))
    lease = models.CharField(_("lease"), max_length=32, blank=True)  # the relay pass sending it
    attempts = models.PositiveIntegerField(_("failed attempts"), default=0)
    last_error = models.TextField(_("last error"), blank=True)

    class Meta:
        verbose_name = _("outbox task")
        verbose_name_plural = _("outbox tasks")
        ordering = ["pk"]
        indexes = [models.Index(fields=["next_attempt_at"], name="rtq_outbox_due")]

    def __str__(self) -> str:
        return f"{self.task_name} {self.task_id} (outbox)"


class TaskEdit(models.Model):
    """A task's arguments edited by hand before it ran again: who, when, from what to what.

    Written in the same database transaction as the edit (see `Operations.edit_and_run`), in
    the mirror's database; the task's page shows them, live or finished.
    """

    task_id = models.CharField(_("task id"), max_length=255, db_index=True)
    task_name = models.CharField(_("task"), max_length=255)
    queue = models.CharField(_("queue"), max_length=255)
    edited_by = models.CharField(_("edited by"), max_length=255, blank=True)  # "" for code
    edited_at = models.DateTimeField(_("edited at"))
    state = models.CharField(_("state before"), max_length=16)  # retry or archived
    old_args = models.JSONField(_("arguments before"), default=list)
    old_kwargs = models.JSONField(_("keyword arguments before"), default=dict)
    new_args = models.JSONField(_("arguments after"), default=list)
    new_kwargs = models.JSONField(_("keyword arguments after"), default=dict)

    class Meta:
        default_permissions = ()
        ordering = ["-edited_at", "-pk"]
        verbose_name = _("task edit")
        verbose_name_plural = _("task edits")

    def __str__(self) -> str:
        return f"{self.task_id} edited by {self.edited_by or 'code'}"
