"""The errors django-rtq raises, and the ones task handlers may raise to steer retries."""


class RTQError(Exception):
    """Base class of django-rtq's errors; never raised directly."""


class InvalidTask(RTQError, ValueError):
    """A task definition, its options or its arguments are not acceptable."""


class TaskNotFound(RTQError, LookupError):
    """No task with that id exists in Redis."""


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


class TaskTimeout(RTQError):
    """The task ran longer than its timeout."""


class DeadlineExceeded(RTQError):
    """The task's deadline passed before it could finish."""


class TaskCancelled(RTQError):
    """The task was cancelled while it ran."""


class LeaseExpired(RTQError):
    """The worker running the task stopped renewing its lease (it died or lost Redis)."""
