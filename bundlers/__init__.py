"""Bundlers: the user's code, made into an immutable record a job can fetch and verify.

CLI: ``launch.bundling.bundler_for(kind).bundle(source_dir, store, options)`` -> :class:`Bundle`,
stored in the spec (``Bundle.to_json``). Runners: ``fetch(Bundle.from_json(...), store,
dest_dir)`` for tar bundles; image bundles are pulled by digest (``Bundle.uri``).
"""

from __future__ import annotations

from typing import Any

from bundlers.base import (
    Bundle,
    BundleError,
    Bundler,
    parse_spec_options,
    with_excludes,
)

__all__ = [
    "Bundle",
    "BundleError",
    "Bundler",
    "fetch",
    "parse_spec_options",
    "with_excludes",
]


def fetch(bundle: Bundle, store: Any, dest_dir: str) -> None:
    """Download, verify and extract a tar bundle into ``dest_dir`` (see bundlers.tar.fetch)."""
    from bundlers.tar import fetch as fetch_tar

    fetch_tar(bundle, store, dest_dir)
