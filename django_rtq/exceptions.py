"""The errors django-rtq raises, and the ones task handlers may raise to steer retries."""

#: The longest a handler may snooze its task (seconds): a day. Longer waits are scheduled tasks.
MAX_SNOOZE_SECONDS = 86400


class RTQError(Exception):
    """Base class of django-rtq's errors; never raised directly."""


class InvalidTask(RTQError, ValueError):
    """A task definition, its options or its arguments are not acceptable."""


class WorkflowTooDeep(InvalidTask):
    """A workflow nests workflows deeper than django-rtq plans and stores (see
    django_rtq.workflows.canvas.MAX_DEPTH); refused before anything is written."""

    def __init__(self, depth: int | None, limit: int) -> None:
        self.depth = depth  # None: it contains itself, so has no depth
        self.limit = limit
        nested = "contains itself" if depth is None else f"nests workflows {depth} deep"
        super().__init__(
            f"This workflow {nested}; at most {limit} levels are allowed (a workflow of tasks is "
            "1 level, one that contains it 2). Flatten it, or make its deeper parts later: "
            "an iterator's steps, or a task that enqueues a workflow of its own."
        )


class InvalidArguments(InvalidTask, TypeError):
    """A call's arguments do not fit its task's signature, are not JSON, or would not reach the
    handler as given (JSON has no tuples, and its object keys are strings)."""


class TaskNotFound(RTQError, LookupError):
    """No task with that id exists in Redis."""


class QueueNotFound(RTQError, LookupError):
    """No queue of that name is configured or was ever enqueued to."""


class QueueInUse(RTQError):
    """A queue cannot be forgotten: it holds tasks or work, or the project names it."""


class BulkJobNotFound(RTQError, LookupError):
    """No action on whole states with that id is recorded (finished ones are kept an hour)."""


class TaskIdConflict(RTQError):
    """A task with the given id already exists."""


class DuplicateTask(RTQError):
    """A unique task with the same uniqueness key is already queued."""


class BrokerUnavailable(RTQError, ConnectionError):
    """Redis could not be reached."""


class InvalidStateTransition(RTQError):
    """The task is not in a state that allows the requested action."""


class NonRetryableError(RTQError):
    """Raised by a handler to archive its task at once, without further retries."""


class Snooze(RTQError):
    """Raised by a handler to run its task again in `seconds` without spending an attempt
    (docs/snooze.md): the task goes to scheduled, due then on the Redis server's clock, with
    its retries left as they were. With `hold_type=True`, no other task of its type in its
    queue starts before then either (a third-party API answered 429 with Retry-After). With
    `hold_partition=True`, no other task of its partition (docs/partitions.md) starts before
    then, and the type's other partitions go on (one tenant's API key was throttled).

    A task without a partition holds nothing but itself with `hold_partition=True` (a warning
    is logged): holding its whole type would stop every partition for one task's sake, so ask
    for that with `hold_type=True`. `hold_type=True` holds the type, its partitions included,
    whatever `hold_partition` says."""

    def __init__(self, seconds: float, *, hold_type: bool = False, hold_partition: bool = False) -> None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_SNOOZE_SECONDS
        ):
            raise ValueError(
                f"Snooze(seconds): a number of seconds from 0 to {MAX_SNOOZE_SECONDS}, not {seconds!r}."
            )
        self.seconds = float(seconds)
        self.hold_type = bool(hold_type)
        self.hold_partition = bool(hold_partition) and not self.hold_type
        held = (
            " (its type held)" if self.hold_type else " (its partition held)" if self.hold_partition else ""
        )
        super().__init__(f"snoozed for {self.seconds:g}s{held}")


class TooManySnoozes(NonRetryableError):
    """The task snoozed more often than `RTQ["MAX_SNOOZES"]` allows: it is archived with this
    error, so that a handler that always snoozes does not keep it forever."""


class TaskTimeout(RTQError):
    """The task ran longer than its timeout."""


class DeadlineExceeded(RTQError):
    """The task's deadline passed before it could finish."""


class TaskCancelled(RTQError):
    """The task was cancelled while it ran."""


class LeaseLost(RTQError):
    """Raised in a running handler whose worker could not renew its lease in time: another
    worker may take the task, so this one stops it."""


class WorkerShutdown(RTQError):
    """Raised in a handler still running when its worker's shutdown timeout ends; the task
    goes back to pending, uncounted."""


class StoppedAtCheckpoint(WorkerShutdown):
    """Raised by `save_checkpoint()` once the checkpoint is saved, in a handler whose worker is
    shutting down: the handler ends at once, and the task goes back to pending, uncounted, to
    resume from that checkpoint."""


class CheckpointNotSaved(RTQError, ValueError):
    """A checkpoint that cannot be saved: not JSON-serialisable, or too long."""


class WorkerLost(RTQError):
    """The task's worker died while running it more often than `RTQ["MAX_RECOVERIES"]` allows:
    it is archived as a poison pill."""


class NoWorkerCanRun(RTQError):
    """The reason a task was archived after waiting RTQ["NO_WORKER_GRACE"] seconds with no live
    worker able to run it (its type unknown to them, its stored format newer than they read, or
    its arguments not fitting their handler)."""


class CorruptWorkflow(RTQError):
    """A waiting workflow's own state in Redis is corrupt: it is archived with this error."""


class RedisMisconfigured(RTQError):
    """Redis's own configuration would lose tasks (it evicts keys when full): a worker refuses
    to start on it unless RTQ["ALLOW_EVICTING_REDIS"] accepts that."""
