"""The API's views: enqueue exposed task types, look at and act on tasks, queues and workers."""

from __future__ import annotations

import inspect
from typing import Any

from django.urls import include, path, reverse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.views import SpectacularAPIView
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import __version__
from ..broker.states import TaskState
from ..conf import get_settings
from ..connection import get_inspector
from ..exceptions import DuplicateTask, InvalidStateTransition, InvalidTask, TaskIdConflict
from ..models import FinishedTask
from ..permissions import API_PERMISSIONS, CHANGE_LIVE, ENQUEUE, VIEW_HISTORY, VIEW_LIVE
from ..registry import TaskType, get_task_type, registered_tasks
from . import serializers as s
from .arguments import argument_errors
from .exceptions import Conflict, translate
from .lookup import as_datetime, find_task, live_task_data
from .pagination import page_bounds, page_data
from .parsers import BoundedJSONParser, check_json_body
from .permissions import ConfiguredAccessMixin
from .schema import CONFLICT, INVALID, NOT_FOUND, documented

#: The states each manual action applies to (the inspector's scripts skip the others).
RUN_FROM = (TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED)
ARCHIVE_FROM = (TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY)
DELETE_FROM = (
    TaskState.PENDING,
    TaskState.SCHEDULED,
    TaskState.RETRY,
    TaskState.ARCHIVED,
    TaskState.COMPLETED,
    TaskState.WAITING,  # a workflow: cancelled first, then deleted
)
#: Cancel stops an active task, or a waiting workflow.
CANCEL_FROM = (TaskState.ACTIVE, TaskState.WAITING)


class APIBase(ConfiguredAccessMixin, APIView):
    # JSON in and out, access from the RTQ settings, django-rtq's errors as HTTP errors. (No
    # docstrings on the views: drf-spectacular would show them as operation descriptions.)

    schema = AutoSchema()
    parser_classes = [BoundedJSONParser]
    renderer_classes = [JSONRenderer]  # the browsable API would need "rest_framework" installed
    #: What `RTQPermissions` (the default permission class) asks of the user; None: no one.
    required_permission: str | tuple[str, ...] | None = None

    def object_permission(self, obj: Any) -> str | None:
        """The permission an object the view found needs besides `required_permission`."""
        return None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authenticated and allowed first
        if request.method == "POST" and hasattr(self, "post"):
            check_json_body(request)

    def handle_exception(self, exc: Exception) -> Response:
        return super().handle_exception(translate(exc))

    def query(self, serializer_class: type[s.serializers.Serializer]) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.query_params)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def url(self, name: str, **kwargs: Any) -> str:
        namespace = self.request.resolver_match.namespace if self.request.resolver_match else "rtq_api"
        return self.request.build_absolute_uri(reverse(f"{namespace}:{name}", kwargs=kwargs))


# Task types and enqueueing


def exposed_task_type(name: str) -> TaskType:
    """The exposed task type of that name; the same 404 whether it is unknown or not exposed."""
    task_type = get_task_type(name)
    if task_type is None or not task_type.exposed:
        raise NotFound(f"No task type named {name!r} is exposed.")
    return task_type


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
        types = sorted((t for t in registered_tasks().values() if t.exposed), key=lambda t: t.name)
        data = [
            {
                "name": t.name,
                "queue": t.options.get("queue") or get_settings().DEFAULT_QUEUE,
                "parameters": describe_parameters(t),
                "doc": inspect.getdoc(t.func),
            }
            for t in types
        ]
        return Response(s.TaskTypeSerializer(data, many=True).data)


class EnqueueView(APIBase):
    required_permission = ENQUEUE

    @documented(
        operation_id="enqueue_task",
        summary="Enqueue a task of an exposed type",
        request=s.EnqueueSerializer,
        responses={201: s.EnqueuedSerializer, 400: INVALID, 404: NOT_FOUND, 409: CONFLICT},
    )
    def post(self, request: Request, name: str) -> Response:
        task_type = exposed_task_type(name)
        conf = get_settings()
        queues = list(dict.fromkeys([*conf.QUEUES, task_type.options.get("queue") or conf.DEFAULT_QUEUE]))
        serializer = s.EnqueueSerializer(data=request.data, context={"queues": queues})
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        args, kwargs = data.pop("args"), data.pop("kwargs")
        errors = argument_errors(task_type.func, args, kwargs)
        if errors:
            raise ValidationError(errors)
        try:
            message = task_type.using(**data).enqueue(*args, **kwargs)
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
            "process_at": as_datetime(message.process_at),
            "url": url,
        }
        return Response(
            s.EnqueuedSerializer(body).data, status=status.HTTP_201_CREATED, headers={"Location": url}
        )


# One task


class TaskDetailView(APIBase):
    required_permission = VIEW_LIVE

    def object_permission(self, obj: Any) -> str | None:
        return None if obj["live"] else VIEW_HISTORY  # a finished task is history

    @documented(
        operation_id="get_task",
        summary="Get a task: state, result, errors, progress",
        parameters=[s.TaskQuerySerializer],
        responses={200: s.TaskSerializer, 400: INVALID, 404: NOT_FOUND},
    )
    def get(self, request: Request, task_id: str) -> Response:
        queue = self.query(s.TaskQuerySerializer).get("queue")
        data = find_task(task_id, queue)
        self.check_object_permissions(request, data)
        return Response(s.TaskSerializer(data).data)


class TaskActionView(APIBase):
    # Acts on one live task by hand; each subclass is one action.

    required_permission = CHANGE_LIVE
    allowed: tuple[TaskState, ...] = ()

    def live_task(self, task_id: str) -> Any:
        queue = self.query(s.TaskQuerySerializer).get("queue")
        task = get_inspector().get_task(task_id, queue)
        if task.state not in self.allowed:
            raise InvalidStateTransition(
                f"Task {task_id!r} is {task.state}; this applies to tasks in {', '.join(self.allowed)}."
            )
        return task

    def moved(self, count: int, task: Any) -> Response:
        if count == 0:  # it changed state meanwhile
            raise Conflict(f"Task {task.id!r} is no longer in a state this applies to.")
        return Response(s.TaskSerializer(live_task_data(get_inspector().get_task(task.id, task.queue))).data)


ACTION_DOC = {
    "parameters": [s.TaskQuerySerializer],
    "request": None,
    "responses": {200: s.TaskSerializer, 400: INVALID, 404: NOT_FOUND, 409: CONFLICT},
}


class TaskRunView(TaskActionView):
    allowed = RUN_FROM

    @documented(operation_id="run_task", summary="Run a scheduled, retry or archived task now", **ACTION_DOC)
    def post(self, request: Request, task_id: str) -> Response:
        task = self.live_task(task_id)
        return self.moved(get_inspector().run_now(task.queue, [task.id]), task)


class TaskArchiveView(TaskActionView):
    allowed = ARCHIVE_FROM

    @documented(
        operation_id="archive_task", summary="Archive a pending, scheduled or retry task", **ACTION_DOC
    )
    def post(self, request: Request, task_id: str) -> Response:
        task = self.live_task(task_id)
        return self.moved(get_inspector().archive(task.queue, [task.id]), task)


class TaskDeleteView(TaskActionView):
    allowed = DELETE_FROM

    @documented(
        operation_id="delete_task",
        summary="Delete a task that is not active",
        parameters=[s.TaskQuerySerializer],
        request=None,
        responses={204: None, 400: INVALID, 404: NOT_FOUND, 409: CONFLICT},
    )
    def post(self, request: Request, task_id: str) -> Response:
        task = self.live_task(task_id)
        if get_inspector().delete(task.queue, [task.id]) == 0:
            raise Conflict(f"Task {task.id!r} is no longer in a state this applies to.")
        return Response(status=status.HTTP_204_NO_CONTENT)


class TaskCancelView(TaskActionView):
    allowed = CANCEL_FROM

    @documented(
        operation_id="cancel_task",
        summary="Cancel an active task (or a waiting workflow)",
        parameters=[s.TaskQuerySerializer],
        request=None,
        responses={202: s.CancelledSerializer, 400: INVALID, 404: NOT_FOUND, 409: CONFLICT},
    )
    def post(self, request: Request, task_id: str) -> Response:
        task = self.live_task(task_id)
        listeners = get_inspector().cancel(task.id)
        if listeners == 0:
            raise Conflict(f"No worker is listening, so task {task.id!r} was not cancelled.")
        body = {"id": task.id, "queue": task.queue, "listeners": listeners}
        return Response(s.CancelledSerializer(body).data, status=status.HTTP_202_ACCEPTED)


# Queues


def known_queue(name: str) -> str:
    """The queue, if it is configured or was ever enqueued to; 404 otherwise."""
    if name not in get_settings().QUEUES and name not in get_inspector().queues():
        raise NotFound(f"No queue named {name!r}.")
    return name


def queue_names() -> list[str]:
    return sorted(set(get_settings().QUEUES) | set(get_inspector().queues()))


class QueueListView(APIBase):
    required_permission = VIEW_LIVE

    @documented(
        operation_id="list_queues",
        summary="List the queues with their stats",
        responses={200: s.QueueSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        inspector = get_inspector()
        stats = [inspector.queue_stats(name) for name in queue_names()]
        return Response(s.QueueSerializer(stats, many=True).data)


class QueueDetailView(APIBase):
    required_permission = VIEW_LIVE

    @documented(
        operation_id="get_queue",
        summary="Get a queue's stats and daily history",
        parameters=[s.QueueQuerySerializer],
        responses={200: s.QueueDetailSerializer, 400: INVALID, 404: NOT_FOUND},
    )
    def get(self, request: Request, queue: str) -> Response:
        days = self.query(s.QueueQuerySerializer)["days"]
        return Response(queue_detail(known_queue(queue), days))


def queue_detail(queue: str, days: int = 7) -> dict[str, Any]:
    inspector = get_inspector()
    data = dict(s.QueueSerializer(inspector.queue_stats(queue)).data)
    data["history"] = [
        {"day": day, "processed": processed, "failed": failed}
        for day, processed, failed in inspector.history(queue, days)
    ]
    return s.QueueDetailSerializer(data).data


class QueuePauseView(APIBase):
    required_permission = CHANGE_LIVE

    @documented(
        operation_id="pause_queue",
        summary="Pause a queue: workers stop claiming from it",
        request=None,
        responses={200: s.QueueDetailSerializer, 404: NOT_FOUND},
    )
    def post(self, request: Request, queue: str) -> Response:
        get_inspector().pause(known_queue(queue))
        return Response(queue_detail(queue))


class QueueResumeView(APIBase):
    required_permission = CHANGE_LIVE

    @documented(
        operation_id="resume_queue",
        summary="Resume a paused queue",
        request=None,
        responses={200: s.QueueDetailSerializer, 404: NOT_FOUND},
    )
    def post(self, request: Request, queue: str) -> Response:
        get_inspector().resume(known_queue(queue))
        return Response(queue_detail(queue))


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
        known_queue(queue)
        query = self.query(s.TaskListQuerySerializer)
        offset, limit = page_bounds(query)
        inspector = get_inspector()
        count = inspector.count(queue, query["state"])
        tasks = (
            inspector.list_tasks(queue, query["state"], offset=offset, limit=limit) if offset < count else []
        )
        results = s.TaskSerializer([live_task_data(task) for task in tasks], many=True).data
        return Response(page_data(request, count=count, offset=offset, limit=limit, results=results))


# Workers and finished tasks


class WorkerListView(APIBase):
    required_permission = VIEW_LIVE

    @documented(
        operation_id="list_workers",
        summary="List the live workers",
        responses={200: s.WorkerSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        return Response(s.WorkerSerializer(get_inspector().workers(), many=True).data)


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
        rows = FinishedTask.objects.using(get_settings().MIRROR_DATABASE).order_by("-finished_at", "task_id")
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
        from .urls import api_urlpatterns

        route = request.resolver_match.route if request.resolver_match else ""
        prefix = route.removesuffix("schema/") if route.endswith("schema/") else ""
        self.patterns = [path(prefix, include((api_urlpatterns, "rtq_api")))]
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
