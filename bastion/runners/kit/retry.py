"""The runners' retry helpers, which live in :mod:`bastion.retry` so that the bucket backends
may use them too (no arrow from ``bastion/bucket/`` up into the runners' kit)."""

from bastion.retry import DEFAULT_DELAY, ReadBack, exponential, read_back, retry

__all__ = ["DEFAULT_DELAY", "ReadBack", "exponential", "read_back", "retry"]
