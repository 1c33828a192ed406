"""The Redis layer: key names, Lua scripts and atomic task-state operations. No Django imports."""

from .broker import Broker
from .claims import ClaimedTask, Completion
from .keys import Keyspace, QueueKeys
from .message import TaskMessage
from .states import TaskState

__all__ = ["Broker", "ClaimedTask", "Completion", "Keyspace", "QueueKeys", "TaskMessage", "TaskState"]
