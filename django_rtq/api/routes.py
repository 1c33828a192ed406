"""The API's routes, without the schema and the catch-all 404 (urls.py adds them)."""

from django.urls import path

from . import bulk_views, edit_views, views

api_urlpatterns = [
    path("task-types/", views.TaskTypeListView.as_view(), name="task-type-list"),
    path("task-types/<str:name>/enqueue/", views.EnqueueView.as_view(), name="enqueue"),
    # `path`: ids stored before ids were checked may hold "/"; the actions come first, so
    # tasks/a/b/run/ is the run of "a/b" (a task whose id ends in "/run" shows as a 405).
    path("tasks/<path:task_id>/run/", views.TaskRunView.as_view(), name="task-run"),
    path("tasks/<path:task_id>/archive/", views.TaskArchiveView.as_view(), name="task-archive"),
    path("tasks/<path:task_id>/delete/", views.TaskDeleteView.as_view(), name="task-delete"),
    path("tasks/<path:task_id>/cancel/", views.TaskCancelView.as_view(), name="task-cancel"),
    path("tasks/<path:task_id>/edit/", edit_views.TaskEditView.as_view(), name="task-edit"),
    path("tasks/<path:task_id>/edits/", edit_views.TaskEditsView.as_view(), name="task-edits"),
    path("tasks/<path:task_id>/", views.TaskDetailView.as_view(), name="task-detail"),
    path("queues/", views.QueueListView.as_view(), name="queue-list"),
    path("queues/<str:queue>/", views.QueueDetailView.as_view(), name="queue-detail"),
    path("queues/<str:queue>/pause/", views.QueuePauseView.as_view(), name="queue-pause"),
    path("queues/<str:queue>/resume/", views.QueueResumeView.as_view(), name="queue-resume"),
    path("queues/<str:queue>/tasks/", views.QueueTasksView.as_view(), name="queue-tasks"),
    path("queues/<str:queue>/bulk/", bulk_views.QueueBulkView.as_view(), name="queue-bulk"),
    path("queues/<str:queue>/bulk/<str:job_id>/", bulk_views.BulkJobDetailView.as_view(), name="bulk-job"),
    path("queues/<str:queue>/purge/", bulk_views.QueuePurgeView.as_view(), name="queue-purge"),
    path("outbox/", views.OutboxView.as_view(), name="outbox"),
    path("workers/", views.WorkerListView.as_view(), name="worker-list"),
    path("finished/", views.FinishedTaskListView.as_view(), name="finished-list"),
]
