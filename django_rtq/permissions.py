"""The permissions that guard the admin's live views and the API: one mapping for both.

| permission | allows |
| --- | --- |
| `VIEW_LIVE` | looking at live tasks, queues, workers and task types |
| `CHANGE_LIVE` | acting: run, archive, delete, cancel tasks; pause and resume queues |
| `ENQUEUE` | enqueueing exposed task types through the API |
| `EDIT_ARGUMENTS` | editing a failed or archived task's arguments and running it again |
| `VIEW_HISTORY` | reading finished tasks (the ORM mirror) |

As in Django's admin, the permission to change a model includes the one to view it:
`change_livetask` lets one look at live tasks, `change_finishedtask` at finished ones.
Superusers (active ones) have every permission.
"""

from __future__ import annotations

from typing import Any

VIEW_LIVE = "django_rtq.view_livetask"
CHANGE_LIVE = "django_rtq.change_livetask"
ENQUEUE = "django_rtq.enqueue_task"
VIEW_HISTORY = "django_rtq.view_finishedtask"
#: Its own permission, not CHANGE_LIVE's: new arguments make a call nobody enqueued, of any
#: task type (exposed to the API or not), as ENQUEUE does for exposed ones.
EDIT_ARGUMENTS = "django_rtq.edit_task_arguments"

#: Every permission of the API, for what any of its users may read (the schema).
API_PERMISSIONS = (VIEW_LIVE, CHANGE_LIVE, ENQUEUE, VIEW_HISTORY, EDIT_ARGUMENTS)

#: Permissions that include another (Django's admin: "change" implies "view").
IMPLIED_BY = {
    VIEW_LIVE: (CHANGE_LIVE,),
    VIEW_HISTORY: ("django_rtq.change_finishedtask",),
}


def has_permission(user: Any, permission: str) -> bool:
    """Whether `user` has `permission`, or one that includes it."""
    return any(user.has_perm(name) for name in (permission, *IMPLIED_BY.get(permission, ())))
