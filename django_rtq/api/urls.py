"""URLs of the API: `path("rtq/api/", include("django_rtq.api.urls"))`; the schema is at `schema/`."""

from django.urls import path, re_path

from . import views

app_name = "rtq_api"

api_urlpatterns = [
    path("task-types/", views.TaskTypeListView.as_view(), name="task-type-list"),
    path("task-types/<str:name>/enqueue/", views.EnqueueView.as_view(), name="enqueue"),
    # `path`: ids stored before ids were checked may hold "/"; the actions come first, so
    # tasks/a/b/run/ is the run of "a/b" (a task whose id ends in "/run" shows as a 405).
    path("tasks/<path:task_id>/run/", views.TaskRunView.as_view(), name="task-run"),
    path("tasks/<path:task_id>/archive/", views.TaskArchiveView.as_view(), name="task-archive"),
    path("tasks/<path:task_id>/delete/", views.TaskDeleteView.as_view(), name="task-delete"),
    path("tasks/<path:task_id>/cancel/", views.TaskCancelView.as_view(), name="task-cancel"),
    path("tasks/<path:task_id>/", views.TaskDetailView.as_view(), name="task-detail"),
    path("queues/", views.QueueListView.as_view(), name="queue-list"),
    path("queues/<str:queue>/", views.QueueDetailView.as_view(), name="queue-detail"),
    path("queues/<str:queue>/pause/", views.QueuePauseView.as_view(), name="queue-pause"),
    path("queues/<str:queue>/resume/", views.QueueResumeView.as_view(), name="queue-resume"),
    path("queues/<str:queue>/tasks/", views.QueueTasksView.as_view(), name="queue-tasks"),
    path("workers/", views.WorkerListView.as_view(), name="worker-list"),
    path("finished/", views.FinishedTaskListView.as_view(), name="finished-list"),
]

urlpatterns = [
    *api_urlpatterns,
    path("schema/", views.SchemaView.as_view(), name="schema"),
    # Last: anything else under the API's prefix is a JSON 404, not Django's HTML page.
    re_path(r"", views.NotFoundView.as_view(), name="not-found"),
]
