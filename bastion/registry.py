"""One registry for every kind Bastion loads by name: runners, bundlers, bucket backends.

Modelled on fsspec's ``register_implementation``:

- a built-in kind is a ``"module:attribute"`` string imported on first use, so a missing SDK
  costs nothing until a job asks for that kind;
- plugins arrive through entry points (``bastion.runners``, ``bastion.bundlers``,
  ``bastion.buckets``), read once, the first time the registry is asked anything, so a
  daemon's settings are validated against the kinds its installed plugins add;
- ``register`` never replaces a kind silently: the same target again is a no-op, another one
  needs ``clobber=True``;
- a kind whose module cannot be imported says which extra or package to install.

This module imports nothing of Bastion's, so every package may use it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Named targets of one kind (``what``: "runner kind", "bundler", "bucket protocol")."""

    def __init__(
        self,
        what: str,
        group: str,
        builtins: Mapping[str, T | str],
        error: Callable[[str], Exception] = LookupError,
        hints: Mapping[str, str] | None = None,
    ) -> None:
        self.what = what
        self.group = group
        self.error = error
        self.hints = dict(hints or {})
        self._targets: dict[str, T | str] = dict(builtins)
        self._loaded: dict[str, T] = {}
        self._plugins_read = False

    # -- registration ------------------------------------------------------------------------
    def register(self, name: str, target: T | str, clobber: bool = False) -> None:
        """Add ``name``: an object, or ``"module:attribute"`` imported on first use."""
        self._read_plugins()
        known = self._targets.get(name)
        if known is not None and known is not target and known != target and not clobber:
            raise ValueError(
                f"{self.what} {name!r} is already registered ({_describe(known)}); "
                "pass clobber=True to replace it"
            )
        self._targets[name] = target
        self._loaded.pop(name, None)

    def _read_plugins(self) -> None:
        """Entry points of ``group``, once; a built-in or an explicit registration wins."""
        if self._plugins_read:
            return
        self._plugins_read = True
        for point in importlib.metadata.entry_points(group=self.group):
            self._targets.setdefault(point.name, point.value)

    # -- lookup ------------------------------------------------------------------------------
    def names(self) -> list[str]:
        self._read_plugins()
        return sorted(self._targets)

    def __contains__(self, name: object) -> bool:
        self._read_plugins()
        return name in self._targets

    def find(self, name: str) -> T | None:
        """The target of ``name`` (imported now if it was a string); None when unknown."""
        self._read_plugins()
        if name in self._loaded:
            return self._loaded[name]
        target = self._targets.get(name)
        if target is None:
            return None
        if isinstance(target, str):
            module, _, attribute = target.partition(":")
            try:
                target = getattr(importlib.import_module(module), attribute)
            except ImportError as e:
                hint = self.hints.get(name) or "is its package installed?"
                raise self.error(f"{self.what} {name!r} cannot load: {e} ({hint})") from e
        self._loaded[name] = target  # type: ignore[assignment]
        return target  # type: ignore[return-value]

    def get(self, name: str) -> T:
        """The target of ``name``; the registry's error naming every known kind otherwise."""
        found = self.find(name)
        if found is None:
            raise self.error(
                f"{self.what} {name!r} is not known; use one of {', '.join(self.names())}"
            )
        return found


def _describe(target: Any) -> str:
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', target)}"
