"""Serializers of the API's requests and responses (they also describe them in the OpenAPI schema)."""

from __future__ import annotations

import math
from typing import Any, TypedDict

from django.core.validators import RegexValidator
from rest_framework import serializers

from ..broker.message import MAX_PRIORITY, MIN_PRIORITY
from ..broker.states import ACTION_STATES, BULK_ACTIONS, Action, ActionNotAllowed, TaskState, check_action
from ..broker.waiting import NEWER_FORMAT, UNBOUND_ARGUMENTS, UNKNOWN_TYPE
from ..models import FinishedTask
from ..task_options import TASK_ID_PATTERN, TASK_ID_RULE

#: Most items a page of a list may hold (`limit`).
MAX_PAGE_SIZE = 500
#: Largest `offset` accepted: far past any real list, and safe for Redis and SQL.
MAX_OFFSET = 2**31 - 1
#: Longest delay accepted when enqueueing, in seconds (ten years).
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600.0
#: Days of history a queue's detail can show.
MAX_HISTORY_DAYS = 90

STATE_CHOICES = [state.value for state in TaskState]
BULK_ACTION_CHOICES = [action.value for action in BULK_ACTIONS]
#: Why workers left a task for one that can run it (broker/waiting.py), with what it means.
WAITING_WHY_CHOICES = [
    (UNKNOWN_TYPE, "the workers do not know its type"),
    (NEWER_FORMAT, "it is stored in a format newer than they read"),
    (UNBOUND_ARGUMENTS, "its arguments do not bind to their handler's signature"),
]


class TaskStateField(serializers.ChoiceField):
    """A task's state: the schema shows each one as the same `TaskStateEnum` (see schema.py)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=STATE_CHOICES, **kwargs)


# Requests


class EnqueueSerializer(serializers.Serializer):
    """The body of an enqueue: the call's arguments and, optionally, per-call options."""

    args = serializers.ListField(child=serializers.JSONField(), required=False, default=list)
    kwargs = serializers.DictField(child=serializers.JSONField(), required=False, default=dict)
    queue = serializers.CharField(required=False, help_text="A queue of RTQ['QUEUES'] (or the task's own).")
    priority = serializers.IntegerField(required=False, min_value=MIN_PRIORITY, max_value=MAX_PRIORITY)
    delay = serializers.FloatField(
        required=False, min_value=0, max_value=MAX_DELAY_SECONDS, help_text="Seconds to wait before running."
    )
    task_id = serializers.CharField(
        required=False,
        trim_whitespace=False,  # " x" is refused, not silently made "x"
        max_length=255,
        # prepare()'s rule, anchored (and shown as the schema's `pattern`).
        validators=[
            # the message is %-formatted with the value: the rule's own "%" is escaped
            RegexValidator(
                rf"\A{TASK_ID_PATTERN.pattern}\Z", f"A task id must be {TASK_ID_RULE}.".replace("%", "%%")
            )
        ],
        help_text=f"An id of your own ({TASK_ID_RULE}); a task with this id must not exist yet.",
    )

    def validate_queue(self, value: str) -> str:
        queues = self.context.get("queues", ())
        if value not in queues:
            raise serializers.ValidationError(
                f"Unknown queue {value!r}; expected one of: {', '.join(queues)}."
            )
        return value

    def validate_delay(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("A valid number is required.")
        return value


class PageQuerySerializer(serializers.Serializer):
    """`limit` and `offset` of a page of a list."""

    limit = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_PAGE_SIZE,
        help_text="Items per page (default API_PAGE_SIZE).",
    )
    offset = serializers.IntegerField(required=False, min_value=0, max_value=MAX_OFFSET, default=0)


class TaskListQuerySerializer(PageQuerySerializer):
    state = serializers.ChoiceField(choices=STATE_CHOICES)


class FinishedQuerySerializer(PageQuerySerializer):
    status = serializers.ChoiceField(choices=FinishedTask.Status.choices, required=False)
    queue = serializers.CharField(required=False, max_length=255)
    task_name = serializers.CharField(required=False, max_length=255)
    finished_after = serializers.DateTimeField(required=False, help_text="Finished at or after (ISO 8601).")
    finished_before = serializers.DateTimeField(required=False, help_text="Finished before (ISO 8601).")


class TaskQuerySerializer(serializers.Serializer):
    queue = serializers.CharField(required=False, help_text="Look in this queue only.")


class QueueQuerySerializer(serializers.Serializer):
    days = serializers.IntegerField(required=False, min_value=1, max_value=MAX_HISTORY_DAYS, default=7)


class BulkActionSerializer(serializers.Serializer):
    """The body of an action on every task of a state of a queue."""

    action = serializers.ChoiceField(
        choices=BULK_ACTION_CHOICES,
        error_messages={
            "invalid_choice": f'"{{input}}" is no action on a whole state: expected one of '
            f"{', '.join(BULK_ACTION_CHOICES)} (cancel is by task only)."
        },
    )
    state = TaskStateField(
        help_text="; ".join(
            f"{action} applies to {', '.join(ACTION_STATES[action])}" for action in BULK_ACTIONS
        )
        + ".",
    )

    task_name = serializers.CharField(
        required=False, default="", help_text="Run only: act on the tasks of this task type only."
    )
    error_class = serializers.CharField(
        required=False,
        default="",
        help_text='Run only: act on the tasks whose last error is of this class only ("builtins.KeyError").',
    )

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        action, state = Action(data["action"]), TaskState(data["state"])
        try:
            check_action(action, state)
        except ActionNotAllowed as exc:
            raise serializers.ValidationError({"state": [str(exc)]}) from exc
        narrowing = {"task_name": data.get("task_name", ""), "error_class": data.get("error_class", "")}
        for name, value in narrowing.items():
            if value and action != Action.RUN:
                raise serializers.ValidationError({name: [f"Only a run can be narrowed, not {action}."]})
        return {"action": action, "state": state, **narrowing}


# Responses


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


class TaskTypeSerializer(serializers.Serializer):
    name = serializers.CharField()
    queue = serializers.CharField(allow_null=True)
    parameters = serializers.ListField(child=serializers.DictField(), help_text="{name, kind, required}")
    doc = serializers.CharField(allow_null=True)


class EnqueuedSerializer(serializers.Serializer):
    id = serializers.CharField()
    task = serializers.CharField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=[TaskState.PENDING.value, TaskState.SCHEDULED.value])
    process_at = serializers.DateTimeField(allow_null=True)
    url = serializers.URLField()


class DebounceFacts(TypedDict):
    """A debounced task's facts, as the API shows them."""

    window: float
    key: str | None
    merged_enqueues: int


class TaskSerializer(serializers.Serializer):
    id = serializers.CharField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=STATE_CHOICES)
    live = serializers.BooleanField(help_text="In Redis; false once only its finished record is left.")
    task = serializers.CharField(allow_null=True, help_text="The task type; null if its message is corrupt.")
    args = serializers.ListField(child=serializers.JSONField())
    kwargs = serializers.DictField(child=serializers.JSONField())
    priority = serializers.IntegerField()
    max_retries = serializers.IntegerField(allow_null=True)
    retried = serializers.IntegerField()
    error = serializers.CharField(allow_null=True, help_text="The last error's message.")
    error_type = serializers.CharField(allow_null=True)
    traceback = serializers.CharField(allow_null=True)
    errors = serializers.ListField(child=serializers.DictField(), help_text="Every attempt's error.")
    result = serializers.JSONField(allow_null=True)
    progress = serializers.JSONField(allow_null=True)
    checkpoint = serializers.JSONField(
        allow_null=True,
        help_text="The latest checkpoint a run of the task saved, which its next run resumes from; "
        "null if none was (or once it completed).",
    )
    checkpointed_at = serializers.DateTimeField(allow_null=True, help_text="When that checkpoint was saved.")
    enqueued_at = serializers.DateTimeField(allow_null=True)
    process_at = serializers.DateTimeField(allow_null=True)
    state_at = serializers.DateTimeField(
        allow_null=True,
        help_text="Next attempt (scheduled, retry), lease expiry (active), archived at, end of retention "
        "(completed), or finished at (not live).",
    )
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    worker = serializers.CharField(allow_null=True)
    held_back = serializers.CharField(
        allow_null=True,
        help_text="Why a pending task is held back by its type's (or its partition's) flow-control "
        "limits (with their use now); null if it is not.",
    )
    partition = serializers.SerializerMethodField(
        help_text="The partition whose turn the task takes (docs/partitions.md); null for none, or "
        "once it has finished."
    )
    snoozed = serializers.IntegerField(
        help_text="How many times its handler snoozed it (raised Snooze: run again later, no attempt "
        "counted); 0 once it has finished.",
    )
    debounce = serializers.SerializerMethodField(
        help_text="A debounced task's window (seconds), key, and the enqueues merged into it "
        "(docs/debounce.md); null if it is not debounced, or finished."
    )

    def get_partition(self, view: Any) -> str | None:
        message = getattr(view, "message", None)
        return None if message is None else message.partition

    def get_debounce(self, view: Any) -> DebounceFacts | None:
        message = getattr(view, "message", None)
        if message is None or message.debounce is None:
            return None
        return {
            "window": message.debounce,
            "key": message.debounce_key,
            "merged_enqueues": message.merged_enqueues,
        }


class CancelledSerializer(serializers.Serializer):
    id = serializers.CharField()
    queue = serializers.CharField()
    listeners = serializers.IntegerField(help_text="Workers that heard the request.")


class BulkJobSerializer(serializers.Serializer):
    id = serializers.CharField()
    queue = serializers.CharField()
    action = serializers.ChoiceField(choices=BULK_ACTION_CHOICES)
    states = serializers.ListField(child=TaskStateField(), help_text="Worked through in this order.")
    current_state = TaskStateField(
        allow_null=True, help_text="The state being worked on; null once finished."
    )
    done = serializers.IntegerField(help_text="Tasks the action moved so far.")
    skipped = serializers.IntegerField(help_text="Tasks left in place: workflows, which cannot run again.")
    total = serializers.IntegerField(
        help_text="Tasks the job expects to act on: each state's size when the job reached it."
    )
    percent = serializers.IntegerField(min_value=0, max_value=100)
    finished = serializers.BooleanField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    started_by = serializers.CharField(allow_blank=True, help_text="Who started it; empty for code.")
    task_name = serializers.CharField(
        allow_blank=True, help_text="The task type it runs only; empty for any."
    )
    error_class = serializers.CharField(
        allow_blank=True, help_text="The class of last error it runs only; empty for any."
    )
    url = serializers.URLField(help_text="Where to follow its progress.")


class EditArgumentsSerializer(serializers.Serializer):
    """The body of an edit: the task's new arguments; one left out keeps its value."""

    args = serializers.ListField(child=serializers.JSONField(), required=False)
    kwargs = serializers.DictField(child=serializers.JSONField(), required=False)

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if "args" not in data and "kwargs" not in data:
            raise serializers.ValidationError({"non_field_errors": ["Give args, kwargs or both."]})
        return data


class TaskEditSerializer(serializers.Serializer):
    """An edit of a task's arguments, as its history keeps it."""

    task_id = serializers.CharField()
    task_name = serializers.CharField()
    queue = serializers.CharField()
    state = TaskStateField(help_text="The state it was edited in.")
    edited_by = serializers.CharField(allow_blank=True, help_text="Who edited it; empty for code.")
    edited_at = serializers.DateTimeField()
    old_args = serializers.ListField(child=serializers.JSONField())
    old_kwargs = serializers.DictField(child=serializers.JSONField())
    new_args = serializers.ListField(child=serializers.JSONField())
    new_kwargs = serializers.DictField(child=serializers.JSONField())


class LimitSerializer(serializers.Serializer):
    rate_limit = serializers.CharField(
        allow_null=True, help_text='Starts per second, minute or hour: "20/s".'
    )
    burst = serializers.IntegerField(
        allow_null=True, help_text="Starts the rate limit allows at once; null without a rate limit."
    )
    max_concurrency = serializers.IntegerField(allow_null=True, help_text="Running at once, at most.")
    description = serializers.CharField(help_text='For people: "20/s (burst 40), at most 3 running".')


class LimitUseSerializer(serializers.Serializer):
    scope = serializers.CharField(
        help_text='A task type\'s name, "*" for the queue\'s own limit, "<task>\\u0002<partition>" for '
        'a partition\'s, "<task>\\u0002" for the limits each partition of the type has.'
    )
    task = serializers.CharField(
        allow_null=True, help_text="The scope's task type; null for the queue's own."
    )
    partition = serializers.CharField(
        allow_null=True,
        allow_blank=True,
        help_text="The scope's partition; \"\" for the limits each partition has; null for a type's or "
        "the queue's own.",
    )
    label = serializers.CharField(help_text='For people: "whole queue", "crm.tasks.sync · partition acme".')
    limit = LimitSerializer(
        allow_null=True,
        help_text="The limit in force; null when only its use is left (a removed limit, draining).",
    )
    running = serializers.IntegerField(help_text="Concurrency slots its running tasks hold.")
    held = serializers.IntegerField(
        help_text="Tasks of this type held back, pending; 0 for the queue's own (it holds none back)."
    )
    tokens = serializers.FloatField(
        allow_null=True, help_text="Starts its rate limit allows at once now; null without a rate limit."
    )


class WaitingKindSerializer(serializers.Serializer):
    task = serializers.CharField(help_text="The task type's name, as the tasks were enqueued.")
    why = serializers.ChoiceField(
        choices=WAITING_WHY_CHOICES,
        help_text="Why the workers that claimed them left them.",
    )
    count = serializers.IntegerField(help_text="Tasks of this kind waiting, pending.")
    since = serializers.DateTimeField(
        allow_null=True, help_text="Since when they wait with no worker taking them."
    )
    reason = serializers.CharField(
        allow_blank=True, help_text="Why, for people: \"unknown task type 'shop.tasks.x'\"."
    )


class QueueSerializer(serializers.Serializer):
    queue = serializers.CharField()
    size = serializers.IntegerField()
    pending = serializers.IntegerField()
    active = serializers.IntegerField()
    scheduled = serializers.IntegerField()
    retry = serializers.IntegerField()
    archived = serializers.IntegerField()
    completed = serializers.IntegerField()
    waiting = serializers.IntegerField(required=False, help_text="Workflows waiting for their children.")
    processed_today = serializers.IntegerField(help_text="Attempts finished today (UTC).")
    failed_today = serializers.IntegerField()
    snoozed_today = serializers.IntegerField(
        required=False, help_text="Attempts that snoozed today (UTC): scheduled again, no attempt counted."
    )
    paused = serializers.BooleanField()
    oldest_pending_age = serializers.FloatField(allow_null=True, help_text="Seconds.")
    limits = LimitUseSerializer(
        many=True,
        help_text="Flow control: the queue's own limit, its task types', and any other in use in it, "
        "each with its use now.",
    )
    waiting_for_worker = WaitingKindSerializer(
        many=True,
        help_text="Pending tasks no worker seen so far could run, by task type and why: they wait "
        "for a worker that can (a deploy with their type), after every task that can run.",
    )


class DayCountSerializer(serializers.Serializer):
    day = serializers.DateField()
    processed = serializers.IntegerField()
    failed = serializers.IntegerField()


class QueueDetailSerializer(QueueSerializer):
    history = DayCountSerializer(many=True, help_text="Daily counters, oldest first.")


class OutboxSerializer(serializers.Serializer):
    waiting = serializers.IntegerField(help_text="Tasks waiting in the outbox to be sent to Redis.")
    oldest = serializers.DateTimeField(
        allow_null=True, help_text="When the oldest waiting task was stored; null when none waits."
    )
    oldest_age_seconds = serializers.FloatField(
        allow_null=True, help_text="How long the oldest task has waited, in seconds; null when none waits."
    )
    failing = serializers.IntegerField(
        help_text="Waiting tasks a worker's relay tried to send and could not (each keeps its last error)."
    )


class RunningTaskSerializer(serializers.Serializer):
    id = serializers.CharField()
    task = serializers.CharField()
    queue = serializers.CharField()
    started_at = serializers.FloatField(allow_null=True, help_text="Epoch seconds.")


class WorkerSerializer(serializers.Serializer):
    id = serializers.CharField()
    host = serializers.CharField(required=False)
    pid = serializers.IntegerField(required=False)
    queues = serializers.DictField(child=serializers.IntegerField(), required=False, help_text="Weights.")
    strict = serializers.BooleanField(required=False)
    concurrency = serializers.IntegerField(required=False)
    started_at = serializers.FloatField(required=False, allow_null=True, help_text="Epoch seconds.")
    active = RunningTaskSerializer(many=True, required=False)
    settings = serializers.CharField(
        required=False, help_text="The worker's Django settings module (not told by workers of 0.1.0)."
    )
    project = serializers.CharField(
        required=False,
        help_text="The fingerprint of the worker's Django project: workers of two projects on one "
        "Redis and key prefix differ in it (not told by workers of 0.1.0).",
    )


class FinishedTaskSerializer(serializers.ModelSerializer):
    class Meta:
        model = FinishedTask
        fields = [
            "task_id",
            "task_name",
            "queue",
            "status",
            "args",
            "kwargs",
            "priority",
            "return_value",
            "error_class",
            "error_message",
            "traceback",
            "errors",
            "attempts",
            "worker",
            "workers",
            "enqueued_at",
            "started_at",
            "finished_at",
            "duration",
            "parent_id",
        ]


def page_serializer(item: type[serializers.Serializer], name: str) -> type[serializers.Serializer]:
    """A serializer class of a page of `item`s, named `name` in the schema."""
    fields: dict[str, Any] = {
        "count": serializers.IntegerField(help_text="Items in the whole list."),
        "limit": serializers.IntegerField(),
        "offset": serializers.IntegerField(),
        "next": serializers.URLField(allow_null=True),
        "previous": serializers.URLField(allow_null=True),
        "results": item(many=True),
    }
    return type(name, (serializers.Serializer,), fields)


TaskPageSerializer = page_serializer(TaskSerializer, "TaskPageSerializer")
FinishedTaskPageSerializer = page_serializer(FinishedTaskSerializer, "FinishedTaskPageSerializer")
