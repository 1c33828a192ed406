"""Load the Lua scripts in `lua/` by file stem, each with the shared helpers in front."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

LUA_DIR = Path(__file__).with_name("lua")
_KEYS_LINE = re.compile(r"^-- KEYS\[(\d+)(\.\.)?\]", re.MULTILINE)
_ARGV_LINE = re.compile(r"^-- ARGV\[(\d+)(\.\.)?\]", re.MULTILINE)


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
    lib = (LUA_DIR / "_lib.lua").read_text()
    scripts = {}
    for path in sorted(LUA_DIR.glob("[!_]*.lua")):
        body = path.read_text()
        source = lib + "\n" + body
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
