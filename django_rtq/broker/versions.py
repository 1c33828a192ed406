"""The versions of the stored formats: what this release writes, and reads (its own and older).

A stored shape (a task's message, its attempt info, a workflow's hash) that gains or changes a
field gets a new version; the golden fixtures of each version in `tests/data/formats/` must
keep running. Version 1 is implicit: it is never written, so that a message of this release
reads the same as one of 0.1.0 (whose workers refuse a field they do not know). A reader that
meets a version newer than its own leaves the task for a worker of a newer release.
"""

from __future__ import annotations

#: The task message (TaskMessage, the queue's `msg` column): its "v" field, written second.
#: The newest this release reads; each message is written in the oldest that holds its fields
#: (TaskMessage.version): 2 only for one that carries a trace context (tracing.py), so that
#: workers of releases that read only 1 still run every other task; 3 only for a debounced one
#: (its debounce window and key, and the count of enqueues merged into it: docs/debounce.md);
#: 4 only for one given a partition (its name and weight: docs/partitions.md), so that a worker
#: of a release without partitions leaves it rather than run it past its partition's limits.
MESSAGE_FORMAT = 4
#: A task's attempt info (AttemptInfo, the queue's `info` column): its "v" fact. The newest this
#: release reads; like a message, an info is written in the oldest version that holds its facts:
#: 2 only for one that counts snoozes ("snoozed", "snoozed_at": docs/snooze.md) or holds a
#: checkpoint ("checkpoint", "checkpointed_at": docs/checkpoints.md), 1 (no "v") otherwise. A
#: worker of 0.1.0 reads no info version: it runs such a task (from its start) and keeps the
#: facts when it rewrites the info.
INFO_FORMAT = 2
#: The info format whose facts count a task's snoozes.
INFO_SNOOZED_FORMAT = 2
#: The info format that added the `checkpoint` and `checkpointed_at` facts (broker/checkpoint.py).
CHECKPOINT_SINCE = 2
#: A workflow's hash (`wf:<id>`): its "v" field. The same as WORKFLOW_FORMAT in _lib.lua.
WORKFLOW_FORMAT = 1


class NewerFormat(ValueError):
    """Stored data of a format newer than this release reads: not corrupt, but for a newer
    worker to run."""

    def __init__(self, what: str, version: int, readable: int) -> None:
        self.what = what
        self.version = version
        self.readable = readable
        super().__init__(
            f"its stored {what} is of format version {version}; this release reads up to {readable}"
        )


def stored_version(value: object) -> int:
    """The version a stored "v" field gives (absent: 1); raise ValueError if it is not one."""
    if value is None:
        return 1
    if type(value) is not int or value < 1:
        raise ValueError(f"format version {value!r} is not a positive integer")
    return value
