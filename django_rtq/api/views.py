"""The API's views: enqueue exposed task types, look at and act on tasks, queues and workers, look
at the outbox.

Each view translates the request into calls of the operations layer (`self.ops`, see base.py)
and their results into JSON: which states an action applies to and where a task is looked for
are decided there, who may make the request by the API's permission classes.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict
from typing import Any

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import __version__
from ..broker.inspect import TaskInfo
from ..broker.states import ACTION_STATES, Action, TaskState
from ..conf import get_settings
from ..exceptions import DuplicateTask, InvalidTask, TaskIdConflict
from ..formats import utc_datetime
from ..operations import ActionReport, Operations
from ..outbox import OutboxStats
from ..permissions import API_PERMISSIONS, CHANGE_LIVE, ENQUEUE, VIEW_HISTORY, VIEW_LIVE
from ..registry import TaskType
from ..task_view import task_view, view_of_live_task
from . import serializers as s
from .arguments import argument_errors
from .base import APIBase
from .exceptions import Conflict
from .pagination import page_bounds, page_data
from .permissions import ConfiguredAccessMixin
from .schema import CONFLICT, INVALID, LOCATION, NOT_FOUND, documented

# Task types and enqueueing


def task_queue(task_type: TaskType) -> str:
    """The queue a task type is enqueued to unless told otherwise."""
    return task_type.options.get("queue") or get_settings().DEFAULT_QUEUE


def describe_parameters(task_type: TaskType) -> list[dict[str, Any]]:
    try:
        params = inspect.signature(task_type.func).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        {"name": p.name, "kind": p.kind.name.lower(), "required": p.default is inspect.Parameter.empty}
        for p in params
    ]


class TaskTypeListView(APIBase):
    required_permission = (VIEW_LIVE, ENQUEUE)  # who may enqueue sees what it may enqueue

    @documented(
        operation_id="list_task_types",
        summary="List the exposed task types",
        responses={200: s.TaskTypeSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        data = [
            {
                "name": t.name,
                "queue": task_queue(t),
                "parameters": describe_parameters(t),
                "doc": inspect.getdoc(t.func),
            }
            for t in self.ops.exposed_task_types()
        ]
        return Response(s.TaskTypeSerializer(data, many=True).data)


class EnqueueView(APIBase):
    required_permission = ENQUEUE

    @documented(
        operation_id="enqueue_task",
        summary="Enqueue a task of an exposed type",
        parameters=[LOCATION],
        request=s.EnqueueSerializer,
        responses={201: s.EnqueuedSerializer, 400: INVALID, 404: NOT_FOUND, 409: CONFLICT},
    )
    def post(self, request: Request, name: str) -> Response:
        task_type = self.ops.exposed_task_type(name)
        queues = list(dict.fromkeys([*self.ops.queues(), task_queue(task_type)]))
        serializer = s.EnqueueSerializer(data=request.data, context={"queues": queues})
        serializer.is_valid(raise_exception=True)
        options = dict(serializer.validated_data)
        args, kwargs = options.pop("args"), options.pop("kwargs")
        errors = argument_errors(task_type.func, args, kwargs)
        if errors:
            raise ValidationError(errors)
        try:
            message = self.ops.enqueue(task_type, args, kwargs, **options)
        except InvalidTask as exc:
            raise ValidationError({"non_field_errors": [str(exc)]}) from None
        except (TaskIdConflict, DuplicateTask) as exc:
            raise Conflict(str(exc)) from None
        url = self.url("task-detail", task_id=message.id)
        body = {
            "id": message.id,
            "task": message.task,
            "queue": message.queue,
            "state": TaskState.SCHEDULED if message.process_at else TaskState.PENDING,
            "process_at": utc_datetime(message.process_at),
            "url": url,
        }
        return Response(
            s.EnqueuedSerializer(body).data, status=status.HTTP_201_CREATED, headers={"Location": url}
        )


# One task


class TaskDetailView(APIBase):
    required_permission = VIEW_LIVE

    def object_permission(self, obj: Any) -> str | None:
        return None if isinstance(obj, TaskInfo) else VIEW_HISTORY  # a finished task is history

    @documented(
        operation_id="get_task",
        summary="Get a task: state, result, errors, progress",
        parameters=[s.TaskQuerySerializer],
        responses={200: s.TaskSerializer, 400: INVALID, 404: NOT_FOUND},
    )
    def get(self, request: Request, task_id: str) -> Response:
        queue = self.query(s.TaskQuerySerializer).get("queue")
        task = self.ops.find_task(task_id, queue)  # a TaskInfo, or a FinishedTask row
        self.check_object_permissions(request, task)
        held_back = self.ops.held_reason(task) if isinstance(task, TaskInfo) else None
        return Response(s.TaskSerializer(task_view(task, held_back)).data)


def applies_to(action: Action) -> str:
    """The states an action applies to, for people: "a scheduled, retry or archived"."""
    states = list(ACTION_STATES[action])
    listed = ", ".join(states[:-1]) + f" or {states[-1]}" if len(states) > 1 else states[0]
    return ("an " if listed[0] in "aeiou" else "a ") + listed


class TaskActionView(APIBase):
    # One manual action on one live task; each subclass is one action.

    required_permission = CHANGE_LIVE
    action: Action

    def act(self, task_id: str) -> ActionReport:
        queue = self.query(s.TaskQuerySerializer).get("queue")
        return self.ops.act_on_one(self.action, task_id, queue)

    def task_now(self, report: ActionReport) -> Response:
        [ref] = report.acted
        task = self.ops.live_task(ref.id, ref.queue)
        return Response(s.TaskSerializer(view_of_live_task(task, self.ops.held_reason(task))).data)


ACTION_DOC = {
    "parameters": [s.TaskQuerySerializer],
    "request": None,
    "responses": {200: s.TaskSerializer, 400: INVALID, 404: NOT_FOUND, 409: CONFLICT},
}


class TaskRunView(TaskActionView):
    action = Action.RUN

    @documented(operation_id="run_task", summary=f"Run {applies_to(Action.RUN)} task now", **ACTION_DOC)
    def post(self, request: Request, task_id: str) -> Response:
        return self.task_now(self.act(task_id))


class TaskArchiveView(TaskActionView):
    action = Action.ARCHIVE

    @documented(
        operation_id="archive_task", summary=f"Archive {applies_to(Action.ARCHIVE)} task", **ACTION_DOC
    )
    def post(self, request: Request, task_id: str) -> Response:
        return self.task_now(self.act(task_id))


class TaskDeleteView(TaskActionView):
    action = Action.DELETE

    @documented(
        operation_id="delete_task",
        summary=f"Delete {applies_to(Action.DELETE)} task",
        description="Delete a task that is not active; a waiting workflow is cancelled first.",
        parameters=[s.TaskQuerySerializer],
        request=None,
        responses={204: None, 400: INVALID, 404: NOT_FOUND, 409: CONFLICT},
    )
    def post(self, request: Request, task_id: str) -> Response:
        self.act(task_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TaskCancelView(TaskActionView):
    action = Action.CANCEL

    @documented(
        operation_id="cancel_task",
        summary="Cancel an active task (or a waiting workflow)",
        parameters=[s.TaskQuerySerializer],
        request=None,
        responses={202: s.CancelledSerializer, 400: INVALID, 404: NOT_FOUND, 409: CONFLICT},
    )
    def post(self, request: Request, task_id: str) -> Response:
        report = self.act(task_id)
        [ref] = report.acted
        body = {"id": ref.id, "queue": ref.queue, "listeners": report.listeners}
        return Response(s.CancelledSerializer(body).data, status=status.HTTP_202_ACCEPTED)


# Queues


def queue_data(ops: Operations, queue: str) -> dict[str, Any]:
    """A queue's stats, flow control and tasks waiting for a worker as `QueueSerializer` data."""
    stats = ops.queue_stats(queue)
    return {
        **asdict(stats),
        "size": stats.size,
        "limits": [use.as_dict() for use in ops.flow_control(queue)],
        "waiting_for_worker": [
            {**asdict(kind), "since": utc_datetime(kind.since)} for kind in ops.waiting_for_worker(queue)
        ],
    }


class QueueView(APIBase):
    # A view of one queue: its stats, flow control and history as the answer.

    def queue_detail(self, queue: str, days: int = 7) -> dict[str, Any]:
        data = queue_data(self.ops, queue)
        data["history"] = [
            {"day": day, "processed": processed, "failed": failed}
            for day, processed, failed in self.ops.history(queue, days)
        ]
        return s.QueueDetailSerializer(data).data


class QueueListView(APIBase):
    required_permission = VIEW_LIVE

    @documented(
        operation_id="list_queues",
        summary="List the queues with their stats and flow control",
        responses={200: s.QueueSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        data = [queue_data(self.ops, name) for name in self.ops.queues()]
        return Response(s.QueueSerializer(data, many=True).data)


class QueueDetailView(QueueView):
    required_permission = VIEW_LIVE

    @documented(
        operation_id="get_queue",
        summary="Get a queue's stats, flow control and daily history",
        parameters=[s.QueueQuerySerializer],
        responses={200: s.QueueDetailSerializer, 400: INVALID, 404: NOT_FOUND},
    )
    def get(self, request: Request, queue: str) -> Response:
        days = self.query(s.QueueQuerySerializer)["days"]
        return Response(self.queue_detail(self.ops.check_queue(queue), days))


class QueuePauseView(QueueView):
    required_permission = CHANGE_LIVE

    @documented(
        operation_id="pause_queue",
        summary="Pause a queue: workers stop claiming from it",
        request=None,
        responses={200: s.QueueDetailSerializer, 404: NOT_FOUND},
    )
    def post(self, request: Request, queue: str) -> Response:
        self.ops.pause(queue)
        return Response(self.queue_detail(queue))


class QueueResumeView(QueueView):
    required_permission = CHANGE_LIVE

    @documented(
        operation_id="resume_queue",
        summary="Resume a paused queue",
        request=None,
        responses={200: s.QueueDetailSerializer, 404: NOT_FOUND},
    )
    def post(self, request: Request, queue: str) -> Response:
        self.ops.resume(queue)
        return Response(self.queue_detail(queue))


class QueueTasksView(APIBase):
    required_permission = VIEW_LIVE

    @documented(
        operation_id="list_queue_tasks",
        summary="List a page of a queue's tasks in a state",
        description="Pending in the order they will run, scheduled and retry by due time, archived and "
        "completed newest first.",
        parameters=[s.TaskListQuerySerializer],
        responses={200: s.TaskPageSerializer, 400: INVALID, 404: NOT_FOUND},
    )
    def get(self, request: Request, queue: str) -> Response:
        self.ops.check_queue(queue)
        query = self.query(s.TaskListQuerySerializer)
        offset, limit = page_bounds(query)
        count = self.ops.count(queue, query["state"])
        tasks = (
            self.ops.list_tasks(queue, query["state"], offset=offset, limit=limit) if offset < count else []
        )
        held_back = self.ops.held_reasons(tasks)
        results = s.TaskSerializer(
            [view_of_live_task(task, held_back.get(task.id)) for task in tasks], many=True
        ).data
        return Response(page_data(request, count=count, offset=offset, limit=limit, results=results))


# The outbox, workers and finished tasks


def outbox_data(stats: OutboxStats) -> dict[str, Any]:
    """The outbox's stats as `OutboxSerializer` data."""
    return {
        "waiting": stats.waiting,
        "oldest": stats.oldest,
        "oldest_age_seconds": stats.age_seconds(),
        "failing": stats.failing,
    }


class OutboxView(APIBase):
    required_permission = VIEW_LIVE  # its tasks are live ones, not in Redis yet

    @documented(
        operation_id="get_outbox",
        summary="Count the tasks waiting in the outbox to be sent to Redis, and the oldest's age",
        description="Read from the database alone: it answers while Redis is unreachable.",
        responses={200: s.OutboxSerializer},
    )
    def get(self, request: Request) -> Response:
        return Response(s.OutboxSerializer(outbox_data(self.ops.outbox_stats())).data)


class WorkerListView(APIBase):
    required_permission = VIEW_LIVE

    @documented(
        operation_id="list_workers",
        summary="List the live workers",
        responses={200: s.WorkerSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        return Response(s.WorkerSerializer(self.ops.workers(), many=True).data)


class FinishedTaskListView(APIBase):
    required_permission = VIEW_HISTORY

    @documented(
        operation_id="list_finished_tasks",
        summary="List finished tasks (the ORM mirror), newest first",
        parameters=[s.FinishedQuerySerializer],
        responses={200: s.FinishedTaskPageSerializer, 400: INVALID},
    )
    def get(self, request: Request) -> Response:
        query = self.query(s.FinishedQuerySerializer)
        offset, limit = page_bounds(query)
        rows = self.ops.finished_tasks().order_by("-finished_at", "task_id")
        for name in ("status", "queue", "task_name"):
            if name in query:
                rows = rows.filter(**{name: query[name]})
        if "finished_after" in query:
            rows = rows.filter(finished_at__gte=query["finished_after"])
        if "finished_before" in query:
            rows = rows.filter(finished_at__lt=query["finished_before"])
        count = rows.count()
        page = list(rows[offset : offset + limit]) if offset < count else []
        results = s.FinishedTaskSerializer(page, many=True).data
        return Response(page_data(request, count=count, offset=offset, limit=limit, results=results))


# The schema


class SchemaView(ConfiguredAccessMixin, SpectacularAPIView):
    """The OpenAPI schema of this API alone, with its paths as mounted."""

    required_permission = API_PERMISSIONS  # any user of the API may read it

    custom_settings = {
        "TITLE": "django-rtq API",
        "DESCRIPTION": "Enqueue exposed task types; inspect and act on tasks, queues and workers.",
        "VERSION": __version__,
        "COMPONENT_SPLIT_REQUEST": True,
    }

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        api_routes = self.patterns  # urls.py gives them: as_view(patterns=routes.api_urlpatterns)
        route = request.resolver_match.route if request.resolver_match else ""
        prefix = route.removesuffix("schema/") if route.endswith("schema/") else ""
        self.patterns = [path(prefix, include((api_routes, "rtq_api")))]
        return super().get(request, *args, **kwargs)

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        # Errors are JSON, as everywhere in the API, whatever format the schema was asked in.
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), "application/json"
        return response


class NotFoundView(APIView):
    # Any other path under the API's prefix (the catch-all route of urls.py): a JSON 404 for every method,
    # before authentication, as Django's own 404 would be.

    schema = None
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    renderer_classes = [JSONRenderer]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        raise NotFound("No such route in the API.")
