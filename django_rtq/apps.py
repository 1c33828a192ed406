"""The app config: finds the task modules (django_rtq/discovery.py), registers the system checks
and puts the project's flow-control limits in force."""

from django.apps import AppConfig


class RTQConfig(AppConfig):
    name = "django_rtq"
    verbose_name = "Task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .discovery import discover_task_modules

        # The workflows first: they register the task that runs iterators, and give the registry
        # what `task.s()` makes, which a tasks module may use as it is imported.
        from .workflows import iterate  # noqa: F401

        discover_task_modules()
        from . import checks  # noqa: F401  (registers the system checks)
        from .connection import use_limits
        from .flow_control import project_limits

        use_limits(project_limits)
