"""Load the Lua scripts in `lua/` by file stem, each with the shared helpers it uses in front."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

LUA_DIR = Path(__file__).with_name("lua")
_KEYS_LINE = re.compile(r"^-- KEYS\[(\d+)(\.\.)?\]", re.MULTILINE)
_ARGV_LINE = re.compile(r"^-- ARGV\[(\d+)(\.\.)?\]", re.MULTILINE)
#: A top-level definition of `_lib.lua`: `local function name(` or `local name =` at column 0.
_DEFINITION = re.compile(r"^local (?:function )?(\w+)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A script's source and SHA1, with the KEYS and ARGV counts its header declares."""

    name: str
    source: str
    sha: str
    fixed_keys: int  # KEYS[1..n] named one by one
    variadic_keys: bool  # a KEYS[n..] line follows them
    fixed_args: int
    variadic_args: bool


@cache
def load_scripts() -> dict[str, LuaScript]:
    """Return every script in `lua/` (but the `_lib` helpers) by its file stem."""
    helpers = _helpers((LUA_DIR / "_lib.lua").read_text())
    scripts = {}
    for path in sorted(LUA_DIR.glob("[!_]*.lua")):
        body = path.read_text()
        source = _used_helpers(helpers, body) + "\n" + body
        keys = _KEYS_LINE.findall(body)
        argv = _ARGV_LINE.findall(body)
        scripts[path.stem] = LuaScript(
            name=path.stem,
            source=source,
            sha=hashlib.sha1(source.encode()).hexdigest(),
            fixed_keys=sum(1 for _, dots in keys if not dots),
            variadic_keys=any(dots for _, dots in keys),
            fixed_args=sum(1 for _, dots in argv if not dots),
            variadic_args=any(dots for _, dots in argv),
        )
    return scripts


def _helpers(lib: str) -> list[tuple[str, str]]:
    """Split `_lib.lua` into its top-level definitions, in order: (name, text) pairs (the
    comment above a definition ends up with the one before it: comments cost nothing)."""
    starts = [match.start() for match in _DEFINITION.finditer(lib)]
    head = lib[: starts[0]] if starts else lib
    chunks = [lib[start:end] for start, end in zip(starts, [*starts[1:], len(lib)], strict=True)]
    return [("", head)] + [(_DEFINITION.match(chunk).group(1), chunk) for chunk in chunks]


def _used_helpers(helpers: list[tuple[str, str]], body: str) -> str:
    """The helpers a script uses, directly or through other helpers, in their file order.

    Redis runs a script's whole source at every call, so defining the forty-odd helpers each
    script does not use would cost several microseconds a call.
    """
    used: set[str] = set()
    texts = [body]
    while texts:
        text = texts.pop()
        for name, chunk in helpers:
            if name and name not in used and re.search(rf"\b{name}\b", text):
                used.add(name)
                texts.append(chunk)
    return "".join(chunk for name, chunk in helpers if not name or name in used)
