"""Check a call's arguments against a task function's signature, naming each bad argument."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def argument_errors(func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Return DRF-style errors, {"args": [...], "kwargs": {name: [...]}}, or {} if the call binds."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to check against (a builtin, say)
        return {}
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return _explain(signature, args, kwargs) or {"non_field_errors": [str(exc)]}
    return {}


def _explain(signature: inspect.Signature, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    params = signature.parameters
    positional = [p for p in params.values() if p.kind in POSITIONAL]
    takes_varargs = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params.values())
    takes_varkw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
    filled = {p.name for p in positional[: len(args)]}
    args_errors: list[str] = []
    kwargs_errors: dict[str, list[str]] = {}

    if len(args) > len(positional) and not takes_varargs:
        args_errors.append(f"At most {len(positional)} positional argument(s) allowed, {len(args)} given.")
    for name in kwargs:
        param = params.get(name)
        keyword = param is not None and param.kind not in VARIADIC
        if keyword and param.kind == inspect.Parameter.POSITIONAL_ONLY and not takes_varkw:
            kwargs_errors[name] = ["positional-only argument: pass it in args"]
        elif keyword and name in filled and param.kind != inspect.Parameter.POSITIONAL_ONLY:
            kwargs_errors[name] = ["given in args as well"]
        elif not keyword and not takes_varkw:
            kwargs_errors[name] = ["unexpected argument"]
    for param in params.values():
        if param.default is not inspect.Parameter.empty or param.kind in VARIADIC or param.name in filled:
            continue
        if param.kind == inspect.Parameter.POSITIONAL_ONLY:
            args_errors.append(f"Missing required positional argument {param.name!r}.")
        elif param.name not in kwargs:
            kwargs_errors[param.name] = ["missing required argument"]

    errors: dict[str, Any] = {}
    if args_errors:
        errors["args"] = args_errors
    if kwargs_errors:
        errors["kwargs"] = kwargs_errors
    return errors
