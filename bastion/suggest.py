"""'Did you mean ...?' for a name typed wrong: one helper, so the daemon's rejections and the
client's checks suggest the same way."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice nearest to ``word`` when one is near enough to be a typo, else None."""
    found = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'docker'?)"``, or "" when nothing is close."""
    near = closest(word, choices)
    return f" (did you mean {near!r}?)" if near else ""
