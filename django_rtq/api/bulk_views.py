"""The API's actions on whole states of a queue (bulk jobs): start one, purge, follow its progress."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from ..broker.bulk import BulkJob
from ..formats import utc_datetime
from ..permissions import CHANGE_LIVE, VIEW_LIVE
from . import serializers as s
from .base import APIBase
from .schema import INVALID, LOCATION, NOT_FOUND, documented

#: How a bulk job goes on, for its operations' descriptions in the schema.
CARRIED_ON = (
    "The request works on it for about a second and answers 202 with where it got to; a worker "
    "serving the queue carries on the rest, a page at a time. Follow it at its `url` (the "
    "`Location` header) until `finished`."
)


class BulkJobView(APIBase):
    # A view that answers with a bulk job.

    def job_data(self, job: BulkJob) -> dict[str, Any]:
        return s.BulkJobSerializer(
            {
                "id": job.id,
                "queue": job.queue,
                "action": job.action,
                "states": job.states,
                "current_state": job.current_state,
                "done": job.done,
                "skipped": job.skipped,
                "total": job.total,
                "percent": job.percent,
                "finished": job.finished,
                "started_at": utc_datetime(job.started_at),
                "finished_at": utc_datetime(job.finished_at),
                "started_by": job.started_by,
                "task_name": job.task_name,
                "error_class": job.error_class,
                "url": self.job_url(job),
            }
        ).data

    def job_url(self, job: BulkJob) -> str:
        return self.url("bulk-job", queue=job.queue, job_id=job.id)

    def started(self, job: BulkJob) -> Response:
        return Response(
            self.job_data(job), status=status.HTTP_202_ACCEPTED, headers={"Location": self.job_url(job)}
        )


class QueueBulkView(BulkJobView):
    required_permission = CHANGE_LIVE

    @documented(
        operation_id="start_bulk_action",
        summary="Run, archive or delete every task of a state of a queue",
        description="A run may be narrowed to one task type (`task_name`) and to the tasks whose "
        "last error is of one class (`error_class`): run again every archived task that failed "
        "with it. " + CARRIED_ON,
        parameters=[LOCATION],
        request=s.BulkActionSerializer,
        responses={202: s.BulkJobSerializer, 400: INVALID, 404: NOT_FOUND},
    )
    def post(self, request: Request, queue: str) -> Response:
        self.ops.check_queue(queue)
        serializer = s.BulkActionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        narrowing = {"task_name": data["task_name"], "error_class": data["error_class"]}
        job = self.ops.start_bulk(data["action"], queue, [data["state"]], **narrowing)
        return self.started(job)


class QueuePurgeView(BulkJobView):
    required_permission = CHANGE_LIVE

    @documented(
        operation_id="purge_queue",
        summary="Delete every task of a queue but the active ones",
        description="Waiting workflows first, then scheduled, retry, pending, archived and completed "
        "tasks. " + CARRIED_ON,
        parameters=[LOCATION],
        request=None,
        responses={202: s.BulkJobSerializer, 404: NOT_FOUND},
    )
    def post(self, request: Request, queue: str) -> Response:
        return self.started(self.ops.purge(queue))


class BulkJobDetailView(BulkJobView):
    required_permission = VIEW_LIVE

    @documented(
        operation_id="get_bulk_action",
        summary="Get how far an action on whole states has got",
        description="A finished one is kept for an hour.",
        responses={200: s.BulkJobSerializer, 404: NOT_FOUND},
    )
    def get(self, request: Request, queue: str, job_id: str) -> Response:
        self.ops.check_queue(queue)
        return Response(self.job_data(self.ops.bulk_job(queue, job_id)))
