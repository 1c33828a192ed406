"""The states a task moves through (asynq's lifecycle)."""

import enum


class TaskState(enum.StrEnum):
    """Where a task is in its life; stored as the task's value in the queue's state hash."""

    SCHEDULED = "scheduled"  # waiting for its process-at time
    PENDING = "pending"  # ready; a free worker will claim it
    ACTIVE = "active"  # claimed by a worker, which holds a lease on it
    RETRY = "retry"  # failed; waiting for its next attempt
    ARCHIVED = "archived"  # out of retries, non-retryable, cancelled, or archived by hand
    COMPLETED = "completed"  # succeeded; kept until its retention ends
    WAITING = "waiting"  # a workflow (chain, group, map/reduce, iterator) waiting for its children


#: States from which a task can be run now, archived or deleted by hand.
INSPECTABLE_STATES = (TaskState.SCHEDULED, TaskState.PENDING, TaskState.RETRY, TaskState.ARCHIVED)
