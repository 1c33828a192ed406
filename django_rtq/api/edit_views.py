"""The API's edit of a failed or archived task's arguments before it runs again, and its history."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from ..exceptions import InvalidTask
from ..permissions import EDIT_ARGUMENTS, VIEW_HISTORY, VIEW_LIVE
from ..registry import get_task_type
from . import serializers as s
from .arguments import argument_errors
from .base import APIBase
from .schema import CONFLICT, INVALID, NOT_FOUND, documented


class TaskEditView(APIBase):
    required_permission = EDIT_ARGUMENTS

    @documented(
        operation_id="edit_task",
        summary="Edit a retry or archived task's arguments and run it again",
        description="The new arguments are checked against the handler's signature, as an enqueue's; "
        "the task moves to pending with them, and the edit (who, old and new arguments) is kept in "
        "its history. 409 if the task moved, or was edited, meanwhile.",
        parameters=[s.TaskQuerySerializer],
        request=s.EditArgumentsSerializer,
        responses={200: s.TaskEditSerializer, 400: INVALID, 404: NOT_FOUND, 409: CONFLICT},
    )
    def post(self, request: Request, task_id: str) -> Response:
        queue = self.query(s.TaskQuerySerializer).get("queue")
        serializer = s.EditArgumentsSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        task = self.ops.editable_task(task_id, queue)
        assert task.message is not None  # editable_task checked
        args = serializer.validated_data.get("args", task.message.args)
        kwargs = serializer.validated_data.get("kwargs", task.message.kwargs)
        task_type = get_task_type(task.message.task)
        errors = argument_errors(task_type.func, args, kwargs) if task_type else {}
        if errors:
            raise ValidationError(errors)
        try:
            edit = self.ops.edit_and_run(task.id, args, kwargs, task.queue)
        except InvalidTask as exc:
            raise ValidationError({"non_field_errors": [str(exc)]}) from None
        return Response(s.TaskEditSerializer(edit).data)


class TaskEditsView(APIBase):
    required_permission = (VIEW_LIVE, VIEW_HISTORY)

    @documented(
        operation_id="list_task_edits",
        summary="List the edits of a task's arguments, the latest first",
        responses={200: s.TaskEditSerializer(many=True), 404: NOT_FOUND},
    )
    def get(self, request: Request, task_id: str) -> Response:
        return Response(s.TaskEditSerializer(self.ops.task_edits(task_id), many=True).data)
