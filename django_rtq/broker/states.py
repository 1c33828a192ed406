"""The states a task moves through (asynq's lifecycle), and the manual actions each allows."""

import enum

from ..exceptions import InvalidStateTransition


class TaskState(enum.StrEnum):
    """Where a task is in its life; stored as the task's value in the queue's state hash."""

    SCHEDULED = "scheduled"  # waiting for its process-at time
    PENDING = "pending"  # ready; a free worker will claim it
    ACTIVE = "active"  # claimed by a worker, which holds a lease on it
    RETRY = "retry"  # failed; waiting for its next attempt
    ARCHIVED = "archived"  # out of retries, non-retryable, cancelled, or archived by hand
    COMPLETED = "completed"  # succeeded; kept until its retention ends
    WAITING = "waiting"  # a workflow (chain, group, map/reduce, iterator) waiting for its children


class Action(enum.StrEnum):
    """What a person can do to a task by hand (admin, API, commands)."""

    RUN = "run"  # move to pending: run now
    ARCHIVE = "archive"  # stop it from running; kept as archived, "archived by hand"
    DELETE = "delete"  # gone, after it ended as archived would if it had not finished
    CANCEL = "cancel"  # stop a running task (its worker archives it) or a waiting workflow


#: The one table of which states each manual action applies to. The scripts receive these
#: states and skip tasks in any other; every surface offers and checks actions from here.
ACTION_STATES: dict[Action, tuple[TaskState, ...]] = {
    Action.RUN: (TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED),
    Action.ARCHIVE: (TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY),
    Action.DELETE: (
        TaskState.PENDING,
        TaskState.SCHEDULED,
        TaskState.RETRY,
        TaskState.ARCHIVED,
        TaskState.COMPLETED,
        TaskState.WAITING,  # a workflow: cancelled first, then deleted
    ),
    Action.CANCEL: (TaskState.ACTIVE, TaskState.WAITING),
}
#: The states in which a task's arguments can be edited before it runs again (run now's
#: script, narrowed): a task that failed and waits for its next attempt, or one archived.
EDIT_STATES = (TaskState.RETRY, TaskState.ARCHIVED)
#: Actions that can apply to every task of a state at once (in pages: see broker/bulk.py).
#: Cancel is by id only: it reaches running tasks one worker at a time.
BULK_ACTIONS = (Action.RUN, Action.ARCHIVE, Action.DELETE)


def actions_for(state: TaskState) -> tuple[Action, ...]:
    """The manual actions a task in `state` allows, in the table's order."""
    return tuple(action for action, states in ACTION_STATES.items() if state in states)


class ActionNotAllowed(InvalidStateTransition):
    """A manual action asked of a task, or of a whole state, in a state the action does not apply to."""

    def __init__(self, action: Action, state: TaskState) -> None:
        self.action, self.state = action, state
        self.allowed = ACTION_STATES[action]
        super().__init__(self.sentence(str(action)))

    def sentence(self, subject: str) -> str:
        """The error as one sentence about `subject` (the action, or the command that asked it):
        "archive applies to pending, scheduled, retry tasks, not completed." """
        return f"{subject} applies to {', '.join(self.allowed)} tasks, not {self.state}."

    @property
    def skip_reason(self) -> str:
        """Why a task in that state is left alone (see skip_reason)."""
        return skip_reason(self.action, self.state)


def skip_reason(action: Action, state: TaskState) -> str:
    """Why `action` leaves a task in `state` alone: "it is completed; archive applies to ... tasks"."""
    return f"it is {state}; {action} applies to {', '.join(ACTION_STATES[action])} tasks"


def allows(action: Action, state: TaskState) -> bool:
    """Whether `action` applies to a task in `state` (ACTION_STATES)."""
    return state in ACTION_STATES[action]


def check_action(action: Action, state: TaskState) -> None:
    """Raise ActionNotAllowed unless `action` applies to a task in `state`."""
    if not allows(action, state):
        raise ActionNotAllowed(action, state)
