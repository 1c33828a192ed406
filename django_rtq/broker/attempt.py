"""A task's attempts: the facts stored of them (its info), and whether a failed one runs again.

The info is a JSON object in the queue's `info` column, written here, by `fail.lua` through
`Broker.fail`, by `snooze.lua` for an attempt that snoozed (`AttemptInfo.snoozing`), by
`complete.lua` for a first attempt that succeeded (`first_attempt_info`), and by the scripts
that archive a task by hand or end a workflow (`_lib.lua`). Its shape is kept as
is: `AttemptInfo` reads it, and `as_dict` gives back exactly what was read. Every writer that
rewrites an info keeps the facts it does not know, its format version "v" among them (absent:
version 1, see versions.py).
"""

from __future__ import annotations

import json
import traceback as tb
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..exceptions import DeadlineExceeded, NonRetryableError, TaskCancelled
from .message import OPTIONAL_NUMBER, OPTIONAL_STR, is_utf8
from .versions import INFO_FORMAT, INFO_SNOOZED_FORMAT, NewerFormat, stored_version

#: Errors that archive a task at once, whatever retries it has left.
NON_RETRYABLE = (NonRetryableError, DeadlineExceeded, TaskCancelled)
#: Errors kept in a task's info, the latest ones (each attempt's error, with its traceback).
ERRORS_KEPT = 10


def error_path(exc: BaseException | type[BaseException]) -> str:
    """The dotted path of an exception's class (or of the class given), as a task's info and
    Django's TaskError name it."""
    cls = exc if isinstance(exc, type) else type(exc)
    module = getattr(cls, "__module__", None)
    return f"{module}.{cls.__qualname__}" if isinstance(module, str) else cls.__qualname__


# An error is recorded whatever the handler raised: an exception whose __str__, __repr__ or
# notes raise (a library's error missing an attribute its __str__ reads) gets a stand-in text,
# so that recording it cannot fail and leave its task to the recoverer as if its worker died.


def error_text(exc: BaseException) -> str:
    """str(exc), or a stand-in saying how that failed."""
    try:
        return str(exc)
    except Exception as failure:
        return f"<str() raised {_what_raised(failure)}>"


def _what_raised(failure: Exception) -> str:
    """The class and text of an error met while formatting another one: a plain one, usually."""
    try:
        return f"{type(failure).__qualname__}: {failure}"
    except Exception:
        return type(failure).__qualname__


def format_traceback(exc: BaseException) -> str:
    """The traceback of an exception as Python prints it; if formatting it raises, its frames
    with a stand-in for what could not be formatted."""
    try:
        return "".join(tb.format_exception(exc))
    except Exception as failure:
        try:
            frames = "".join(tb.format_tb(exc.__traceback__))
        except Exception:
            frames = "  <its frames could not be formatted>\n"
        return (
            f"Traceback (most recent call last):\n{frames}{error_path(exc)}: {error_text(exc)}\n"
            f"<formatting the traceback raised {_what_raised(failure)}>\n"
        )


def will_retry(
    error: BaseException, *, retried: int, max_retries: int, deadline: float | None, now: float
) -> bool:
    """Whether a task whose attempt raised `error` runs again: not for an error that archives at
    once (NON_RETRYABLE), nor without retries left, nor once its deadline has passed."""
    return (
        not isinstance(error, NON_RETRYABLE)
        and retried < max_retries
        and (deadline is None or deadline > now)
    )


#: The attempt facts whose types the worker relies on.
_INFO_TYPES: dict[str, tuple[type, ...]] = {
    "retried": (int,),
    "snoozed": (int,),
    "recovered": (int,),
    "requeued": (int,),
    "errors": (list,),
    "workers": (list,),
    "started_at": OPTIONAL_NUMBER,
    "attempted_at": OPTIONAL_NUMBER,
    "worker": OPTIONAL_STR,
    "error": (str,),
    "error_type": (str,),
    "traceback": (str,),
    "checkpoint": (str,),
    "checkpointed_at": OPTIONAL_NUMBER,
}


def info_version(info: Mapping[str, Any]) -> int:
    """The format version of a task's info (its "v" fact; absent: 1); raise ValueError if the
    fact is not one."""
    return stored_version(info.get("v"))


def check_info_version(info: Mapping[str, Any]) -> None:
    """Raise NewerFormat if a task's info is of a format newer than INFO_FORMAT (a worker of a
    newer release is to run it), ValueError if its version is not one."""
    version = info_version(info)
    if version > INFO_FORMAT:
        raise NewerFormat("info", version, INFO_FORMAT)


def info_version_or_1(info: Mapping[str, Any]) -> int:
    """The format version of a task's info, 1 when its "v" fact is not one."""
    try:
        return info_version(info)
    except ValueError:
        return 1


def parse_info(raw: str | None) -> tuple[dict[str, Any], str | None]:
    """Read a task's stored info (attempt facts) as a worker claims it. Never raises: return
    the info, with the facts of a wrong type left out, and what was wrong with it (None if
    nothing was). Its format version "v" is kept as it is, for check_info_version."""
    if not raw:
        return {}, None
    if not raw.isascii() and not is_utf8(raw):
        return {}, f"not UTF-8: {raw[:80]!r}"
    try:
        info = json.loads(raw)
    except ValueError:
        return {}, f"not JSON: {raw[:80]!r}"
    if not isinstance(info, dict):
        return {}, f"not a JSON object: {raw[:80]!r}"
    wrong = [
        name
        for name, types in _INFO_TYPES.items()
        if name in info and (not isinstance(info[name], types) or isinstance(info[name], bool))
    ]
    if isinstance(info.get("errors"), list) and not all(isinstance(e, dict) for e in info["errors"]):
        wrong.append("errors")
    if not wrong:
        return info, None
    for name in wrong:
        info.pop(name, None)
    return info, f"of the wrong type in {', '.join(sorted(set(wrong)))}"


def error_records(errors: list[Any]) -> list[dict[str, Any]]:
    """Recorded errors ({"type", "message", "traceback"}), leaving out any malformed."""
    return [error for error in errors if isinstance(error, dict)]


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptInfo:
    """A task's attempt facts as stored (its info); a fact missing, or of the wrong type, reads
    as None, 0 or empty. `stored` keeps every fact as read, in its order, others included
    (`recovered`, `requeued`, a workflow's `progress` and `children`...)."""

    retried: int = 0  # retries made so far
    worker: str | None = None  # of the latest attempt
    workers: list[Any] = field(default_factory=list)  # one per attempt, as stored
    started_at: float | None = None  # of the first attempt, epoch seconds
    attempted_at: float | None = None  # of the latest attempt
    finished_at: float | None = None  # when it succeeded
    failed_at: float | None = None  # when its latest attempt failed
    error: str | None = None  # the latest error's message
    error_type: str | None = None  # its class's dotted path
    traceback: str | None = None
    errors: list[Any] = field(default_factory=list)  # {"type", "message", "traceback"} per failure
    stored: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_json(cls, raw: str | None) -> AttemptInfo:
        """Read a stored info; empty for none (a task not attempted yet)."""
        return cls.from_mapping(json.loads(raw) if raw else {})

    @classmethod
    def from_mapping(cls, info: Mapping[str, Any] | None) -> AttemptInfo:
        info = dict(info) if isinstance(info, Mapping) else {}
        return cls(
            retried=_count(info.get("retried")),
            worker=_text(info.get("worker")),
            workers=_list(info.get("workers")),
            started_at=_number(info.get("started_at")),
            attempted_at=_number(info.get("attempted_at")),
            finished_at=_number(info.get("finished_at")),
            failed_at=_number(info.get("failed_at")),
            error=_text(info.get("error")),
            error_type=_text(info.get("error_type")),
            traceback=_text(info.get("traceback")),
            errors=_list(info.get("errors")),
            stored=MappingProxyType(info),
        )

    @property
    def snoozed(self) -> int:
        """How many times its handler snoozed it (raised Snooze): no attempt counted for those."""
        return _count(self.stored.get("snoozed"))

    def snoozing(self, snoozed_at: float) -> dict[str, Any]:
        """The info to store for an attempt that snoozed: one more snooze counted, no attempt
        (its retries, workers and errors stay as they were). Of format INFO_SNOOZED_FORMAT."""
        version = max(info_version_or_1(self.stored), INFO_SNOOZED_FORMAT)
        return {**self.stored, "v": version, "snoozed": self.snoozed + 1, "snoozed_at": snoozed_at}

    def as_dict(self) -> dict[str, Any]:
        """The info as stored: every fact read, in its order."""
        return dict(self.stored)

    def get(self, name: str, default: Any = None) -> Any:
        """A stored fact that has no field of its own (`progress`, `children`...), as stored."""
        return self.stored.get(name, default)

    @property
    def ended_at(self) -> float | None:
        """When it finished: succeeded, or its latest attempt failed."""
        return self.finished_at or self.failed_at

    @property
    def error_records(self) -> list[dict[str, Any]]:
        """The recorded errors, one per failed attempt (the latest ones), leaving out any malformed."""
        return error_records(self.errors)

    def attempted(self, worker_id: str, started_at: float | None) -> dict[str, Any]:
        """The info to store with the attempt that just ended added: who ran it and when it
        started (complete.lua writes the same for a first attempt that succeeded)."""
        stored = self.stored
        return {
            **stored,
            "started_at": stored.get("started_at") or started_at,  # of the first attempt
            "attempted_at": started_at,  # of the latest attempt
            "worker": worker_id,
            "workers": [*stored.get("workers", ()), worker_id],  # one per attempt
        }

    @property
    def checkpoint_json(self) -> str | None:
        """The JSON text of the checkpoint a run saved (save_checkpoint.lua), if any."""
        return _text(self.stored.get("checkpoint"))

    @property
    def checkpointed_at(self) -> float | None:
        """When that checkpoint was saved, epoch seconds."""
        return _number(self.stored.get("checkpointed_at"))

    def succeeded(self, worker_id: str, started_at: float | None, finished_at: float) -> dict[str, Any]:
        """The info to store for an attempt that succeeded (complete.lua writes it itself for a
        first attempt, from its times): its checkpoint is dropped, nothing resumes from it."""
        info = {**self.attempted(worker_id, started_at), "finished_at": finished_at}
        info.pop("checkpoint", None)
        info.pop("checkpointed_at", None)
        return info

    def failed(
        self,
        error: BaseException,
        traceback: str,
        *,
        worker_id: str,
        started_at: float | None,
        failed_at: float,
        retrying: bool,
    ) -> dict[str, Any]:
        """The info to store for an attempt that failed: its error added to the latest ones, and
        one more retry counted if it runs again."""
        path = error_path(error)
        record = {"type": path, "message": error_text(error) or path, "traceback": traceback}
        info: dict[str, Any] = {
            **self.attempted(worker_id, started_at),
            "error_type": record["type"],
            "error": record["message"],
            "traceback": traceback,
            "errors": [*self.stored.get("errors", ()), record][-ERRORS_KEPT:],
            "failed_at": failed_at,
        }
        if retrying:
            info["retried"] = self.retried + 1
        return info
