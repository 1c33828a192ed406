"""The progress page of a bulk job (an action on whole states of a queue), and carrying it on."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.views.decorators.http import require_POST

from ..broker.bulk import PURGE_STATES, BulkJob
from ..broker.states import Action
from ..exceptions import BulkJobNotFound
from ..formats import django_datetime, format_duration, plural
from ..operations import DONE, Operations
from .actions import LABELS, describe_narrowing
from .common import admin_url, live_view, page_context

#: How often (seconds) the progress page of a running job reloads itself.
REFRESH_SECONDS = 2


@live_view()
def bulk_progress(
    request: HttpRequest, model_admin: ModelAdmin, ops: Operations, queue: str, job_id: str
) -> HttpResponse:
    job = find_job(ops, queue, job_id)
    context = page_context(
        request,
        model_admin,
        title=job_title(job),
        job=describe_job(model_admin, job),
        refresh=None if job.finished else REFRESH_SECONDS,
        carry_on_url=admin_url(model_admin, "bulk_carry_on", queue, job.id),
        dashboard_url=admin_url(model_admin, "dashboard"),
    )
    return TemplateResponse(request, "admin/django_rtq/bulk.html", context)


@require_POST
@live_view(acts=True)
def bulk_carry_on(
    request: HttpRequest, model_admin: ModelAdmin, ops: Operations, queue: str, job_id: str
) -> HttpResponse:
    before = find_job(ops, queue, job_id)
    job = ops.carry_on(queue, job_id)
    if job.finished and not before.finished:
        messages.success(request, f"Finished: {done_text(job)}.")
    elif not job.finished and job.pages == before.pages:
        messages.info(request, "A worker is carrying it on right now: this page follows its progress.")
    return HttpResponseRedirect(admin_url(model_admin, "bulk", queue, job.id))


def find_job(ops: Operations, queue: str, job_id: str) -> BulkJob:
    try:
        return ops.bulk_job(queue, job_id)
    except BulkJobNotFound as exc:
        raise Http404(str(exc)) from None


def is_purge(job: BulkJob) -> bool:
    return job.action == Action.DELETE and tuple(job.states) == PURGE_STATES


def job_title(job: BulkJob) -> str:
    """The job's name for people: Empty queue 'emails', or Delete: archived tasks of queue 'emails'."""
    if is_purge(job):
        return f"Empty queue {job.queue!r}"
    narrowing = describe_narrowing(task_name=job.task_name, error_class=job.error_class)
    return f"{LABELS[job.action]}: {', '.join(job.states)} tasks of queue {job.queue!r}" + (
        f" {narrowing}" if narrowing else ""
    )


def done_text(job: BulkJob) -> str:
    """How far it got, as in: 1,200 of 5,000 tasks deleted."""
    return f"{job.done:,} of {plural(job.total, 'task')} {DONE[job.action]}"


def skipped_text(job: BulkJob) -> str | None:
    if not job.skipped:
        return None
    if job.narrowed:
        return (
            f"{plural(job.skipped, 'task')} left in place: of another type or error, or workflows "
            "(a finished one cannot run again)"
        )
    return f"{plural(job.skipped, 'workflow')} left in place: a finished workflow cannot run again"


def describe_job(model_admin: ModelAdmin, job: BulkJob) -> dict[str, Any]:
    """What the progress page and the dashboard show of a job."""
    return {
        "id": job.id,
        "queue": job.queue,
        "title": job_title(job),
        "url": admin_url(model_admin, "bulk", job.queue, job.id),
        "percent": job.percent,
        "done": done_text(job),
        "skipped": skipped_text(job),
        "states": [
            {
                "name": state,
                "count": count,
                "current": state == job.current_state,
                "url": admin_url(model_admin, "tasks", state, query={"queue": job.queue}),
            }
            for state, count in zip(job.states, job.counts, strict=True)
        ],
        "current_state": job.current_state,
        "finished": job.finished,
        "started_by": job.started_by,
        "started_at": django_datetime(job.started_at),
        "updated_at": django_datetime(job.updated_at),
        "finished_at": django_datetime(job.finished_at),
        "took": format_duration(job.finished_at - job.started_at) if job.finished_at is not None else None,
    }
