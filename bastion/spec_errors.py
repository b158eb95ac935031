"""The error every spec check raises, and the helpers that keep its message short whatever
the user wrote (a message becomes a job's reason, stored in its state)."""

from __future__ import annotations

from typing import Any

MAX_SHOWN = 80  # characters of a user's value that an error message echoes
MAX_MESSAGE = 1000


class SpecError(ValueError):
    """A spec that cannot be accepted; the message names the field and the fix.

    The message becomes a job's reason, shown by `bastion list` and stored in its state, so it
    is bounded whatever the user wrote (values are shortened by ``show`` where they are echoed;
    this cap is the backstop)."""

    def __init__(self, message: str) -> None:
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        super().__init__(message)


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """``text``, or its first ``limit`` characters and its length."""
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} characters)"


def show(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters plus its length."""
    try:
        text = repr(value)
    except ValueError:  # an integer over Python's 4,300-digit conversion limit
        return f"<an integer of {value.bit_length()} bits>"
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, str | bytes | list | dict) else len(text)
    return f"{text[:limit]}…({size} characters)"
