"""Shared strings for parsed JSON the daemon keeps: 100,000 active jobs' specs and states
repeat the same keys and a few short values (statuses, kinds, users, projects, resource
names), and json shares equal strings only within one document."""

from __future__ import annotations

import sys
from typing import Any

SHORT = 16  # characters: a value this short may be repeated across jobs; longer ones rarely
# Distinct short values shared: the repeated ones appear among the first few jobs; past the
# bound a value is shared only if it is already known, so unique ones (job names) cost no
# table that grows with the queue.
_MAX_SHARED = 4096
_shared: dict[str, str] = {}


def interned(value: Any) -> Any:
    """``value`` (parsed JSON) with every key interned and short string values shared: equal
    strings are one object across documents."""
    if isinstance(value, dict):
        return {sys.intern(k): interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interned(v) for v in value]
    if isinstance(value, str) and len(value) <= SHORT:
        return _share(value)
    return value


def _share(text: str) -> str:
    if len(_shared) < _MAX_SHARED:
        return _shared.setdefault(text, text)
    return _shared.get(text, text)
