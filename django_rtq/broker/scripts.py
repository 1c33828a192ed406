"""Load the Lua scripts in `lua/` by file stem, each with the shared helpers it uses in front.

Each script starts with a header naming its KEYS and ARGV, one line each:

    -- KEYS[1] -> rtq:{<queue>}:pending
    -- KEYS[2..] -> rtq:{<queue>}:unique:<key>, one per task that has a unique key
    -- ARGV[1] -> now (ms)

The loader parses the KEYS lines into the key names each position takes (`LuaScript.keys`).
Callers still pass their keys as a list of `QueueKeys` attributes, in the header's order:
building keys from the names at each call would cost time on the hot path (a claim, a
settle), and a list typed out reads as plainly as the header. Instead tests/test_scripts.py
runs every operation and checks each key every call passed, by name, against its position's
line (`key_pattern`): a key out of order or of another queue fails there.

A script may declare flags on its first line, as Redis 7 reads them (`#!lua flags=allow-oom`);
the loader keeps that line first, before the helpers. Redis then applies every rule of a
script with flags: its keys must be declared and in one slot, as ours are anyway.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

LUA_DIR = Path(__file__).with_name("lua")
#: A header line, with the lines that carry it on ("--" and two spaces or more):
#: (KEYS or ARGV, index, ".." when it stands for the rest, what it says).
_HEADER_LINE = re.compile(r"^-- (KEYS|ARGV)\[(\d+)(\.\.)?\] -> (.*(?:\n--  +.*)*)", re.MULTILINE)
#: A top-level definition of `_lib.lua`: `local function name(` or `local name =` at column 0.
_DEFINITION = re.compile(r"^local (?:function )?(\w+)", re.MULTILINE)
#: A key's name in a header: the prefix, the queue's hash tag, then the rest with `<...>` parts.
_KEY_NAME = re.compile(r"rtq:\{<queue>\}:(?:<[^>]*>|[^\s,<])+")
#: A Lua comment to the end of its line (the scripts have no `--[[ ]]` ones, nor "--" in a string).
_LUA_COMMENT = re.compile(r"--[^\n]*")
#: A script's first line declaring its flags to Redis (7.0+): "#!lua flags=allow-oom".
_SHEBANG = re.compile(r"\A#!lua(?: flags=([\w,-]*))?\n")


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A script's source and SHA1, with the KEYS and ARGV its header declares."""

    name: str
    source: str
    sha: str
    keys: tuple[str, ...]  # what KEYS[1..n] are, one by one: "rtq:{<queue>}:pending"
    more_keys: str  # what the KEYS[n+1..] line says follows them ("" when none does)
    fixed_args: int  # ARGV[1..n] named one by one
    variadic_args: bool  # an ARGV[n+1..] line follows them
    flags: tuple[str, ...] = ()  # what its `#!lua flags=` line declares to Redis

    @property
    def fixed_keys(self) -> int:
        return len(self.keys)

    @property
    def variadic_keys(self) -> bool:
        return bool(self.more_keys)


@cache
def load_scripts() -> dict[str, LuaScript]:
    """Return every script in `lua/` (but the `_lib` helpers) by its file stem."""
    helpers = _helpers((LUA_DIR / "_lib.lua").read_text())
    scripts = {}
    for path in sorted(LUA_DIR.glob("[!_]*.lua")):
        body = path.read_text()
        shebang = _SHEBANG.match(body)
        first_line, body = (shebang.group(0), body[shebang.end() :]) if shebang else ("", body)
        source = first_line + _used_helpers(helpers, body) + "\n" + body
        header: dict[str, list[tuple[bool, str]]] = {"KEYS": [], "ARGV": []}  # (variadic, text)
        for kind, index, rest, text in _HEADER_LINE.findall(body):
            lines = header[kind]
            if int(index) != len(lines) + 1 or (lines and lines[-1][0]):
                raise ValueError(f"{path.name}: {kind}[{index}] is out of order in the header")
            lines.append((bool(rest), " ".join(line.strip("- ") for line in text.splitlines())))
        keys, argv = header["KEYS"], header["ARGV"]
        scripts[path.stem] = LuaScript(
            name=path.stem,
            source=source,
            sha=hashlib.sha1(source.encode()).hexdigest(),
            keys=tuple(text for rest, text in keys if not rest),
            more_keys=next((text for rest, text in keys if rest), ""),
            fixed_args=sum(1 for rest, _ in argv if not rest),
            variadic_args=any(rest for rest, _ in argv),
            flags=tuple(filter(None, (shebang.group(1) or "").split(","))) if shebang else (),
        )
    return scripts


def key_pattern(header_text: str) -> re.Pattern[str]:
    """The keys a header's words for a key stand for: each key name in them (one, or "a or b")
    with any prefix for `rtq`, the queue (group `queue`) for `<queue>`, any text for `<...>`."""
    names = _KEY_NAME.findall(header_text)
    if not names:
        raise ValueError(f"no key name in {header_text!r}")
    alternatives = []
    for name in names:
        rest = name.removeprefix("rtq:{<queue>}:")
        parts = re.split(r"<[^>]*>", rest)
        alternatives.append(".+".join(re.escape(part) for part in parts))
    return re.compile(rf"(?:.+):\{{(?P<queue>[^}}]*)\}}:(?:{'|'.join(alternatives)})")


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
    script does not use would cost several microseconds a call. A name in a comment is no use:
    only the code is searched.
    """
    used: set[str] = set()
    texts = [body]
    while texts:
        text = _LUA_COMMENT.sub("", texts.pop())
        for name, chunk in helpers:
            if name and name not in used and re.search(rf"\b{name}\b", text):
                used.add(name)
                texts.append(chunk)
    return "".join(chunk for name, chunk in helpers if not name or name in used)
