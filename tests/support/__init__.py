"""Helpers the tests share: factories, readers, users, fixtures, processes, servers and polling."""

from pathlib import Path

#: The repository's root (the directory of pyproject.toml).
ROOT = Path(__file__).resolve().parent.parent.parent
