"""Workflows: chain, group, chord, map/reduce and iterator, tracked through commands."""

from ..registry import Signature
from .canvas import chain, chord, group, iterator, map_reduce
from .commands import apply_due

__all__ = ["Signature", "apply_due", "chain", "chord", "group", "iterator", "map_reduce"]
