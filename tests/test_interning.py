"""``bastion.interning.interned``: parsed JSON whose repeated strings are one object across
documents (100,000 jobs' specs and states repeat the same keys and short values), with the
document itself unchanged."""

from __future__ import annotations

import json

from bastion import interning
from bastion.interning import SHORT, interned


def _parsed(document: object) -> object:
    return json.loads(json.dumps(document))  # json shares strings only within one document


def test_keys_and_short_values_are_one_object_across_documents(monkeypatch) -> None:
    monkeypatch.setattr(interning, "_shared", {})  # earlier tests may have filled the table
    first = interned(_parsed({"status": "PENDING", "events": [{"kind": "local"}]}))
    second = interned(_parsed({"status": "PENDING", "events": [{"kind": "local"}]}))
    assert first == second
    assert first["status"] is second["status"]
    assert first["events"][0]["kind"] is second["events"][0]["kind"]
    assert next(iter(first["events"][0])) is next(iter(second["events"][0]))  # the key


def test_the_document_is_unchanged_whatever_its_nesting_and_leaves() -> None:
    document = {
        "a": [1, 2.5, None, True, "x" * (SHORT + 1), ["deep", {"deeper": [[]]}]],
        "b": {"c": {}, "d": "", "e": False},
        "list_of_strings": ["one", "two"],
    }
    assert interned(_parsed(document)) == document
    assert interned(_parsed(["top", "level", 3])) == ["top", "level", 3]
    assert interned(_parsed("short")) == "short"


def test_long_values_are_not_shared_and_unknown_ones_past_the_bound_are_not_kept(
    monkeypatch,
) -> None:
    long = "y" * (SHORT + 1)
    assert interned(_parsed({"k": long}))["k"] is not interned(_parsed({"k": long}))["k"]
    monkeypatch.setattr(interning, "_shared", {})
    monkeypatch.setattr(interning, "_MAX_SHARED", 1)
    interned(_parsed({"k": "kept"}))
    interned(_parsed({"k": "not-kept"}))
    assert interning._shared == {"kept": "kept"}
