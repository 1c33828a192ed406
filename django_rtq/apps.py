"""The app config: finds the `tasks` modules of installed apps and registers the system checks."""

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class RTQConfig(AppConfig):
    name = "django_rtq"
    verbose_name = "Task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The workflows first: they register the task that runs iterators, and give the registry
        # what `task.s()` makes, which a tasks module may use as it is imported.
        from .workflows import iterate  # noqa: F401

        autodiscover_modules("tasks")
        from . import checks  # noqa: F401  (registers the system checks)
