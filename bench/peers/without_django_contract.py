"""A bench-only app that takes Django's part out of the `django.tasks` runner (not a setting
anyone should run: the floor of bench/django_tasks_worker_cost.py). The runner then builds no
`TaskResult` and sends neither `task_started` nor, through django-rtq's `task_succeeded`,
`task_finished`; what is left is django-rtq's worker running the same function as `@task` does."""

from django.apps import AppConfig


class WithoutDjangoContract(AppConfig):
    name = "bench.peers.without_django_contract"
    label = "bench_without_django_contract"

    def ready(self) -> None:
        from django_rtq import backends
        from django_rtq import signals as rtq_signals

        class Unsent:
            @staticmethod
            def send(*args: object, **kwargs: object) -> list:
                return []

        backends._running_result = lambda *args, **kwargs: None
        backends.task_started = Unsent()
        rtq_signals.task_succeeded.disconnect(dispatch_uid="django_rtq.backends.task_finished")
