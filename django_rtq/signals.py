"""Signals sent as tasks move through their lifecycle.

Every signal's `sender` is the task's `TaskType` (None for a task whose type is unknown) and
carries `message`, the task's `TaskMessage`. Receivers run in the thread that sends: the
enqueuing code for `task_enqueued`, a worker's executor thread for `task_started` and
`task_succeeded`, a worker's settling thread for `task_retried`, `task_snoozed` and `task_failed`.
"""

from django.dispatch import Signal

#: A task was enqueued (after Redis accepted it).
task_enqueued = Signal()
#: A worker starts an attempt; also receives `worker_id`.
task_started = Signal()
#: An attempt returned; also receives `result`, the return value.
task_succeeded = Signal()
#: An attempt failed and will be retried; also receives `error`, `retry_at` (epoch seconds) and
#: `info`, the task's attempt facts as stored with this failure (broker/attempt.py).
task_retried = Signal()
#: A task failed for good and was archived; also receives `error` and `info`, as above. It is
#: the worker's one decision that the task will not run again (`will_retry` in settle_failure).
task_failed = Signal()
#: A handler raised `Snooze`: the task runs again at `until` (epoch seconds, the Redis server's
#: clock) without an attempt counted; also receives `seconds`, `hold_type`, `hold_partition`
#: (whether its partition is held: never for a task without one) and `snoozed`, how many times
#: the task has snoozed now.
task_snoozed = Signal()
