"""``bastion.interning.interned``: parsed JSON whose repeated strings are one object across
documents (100,000 jobs' specs and states repeat the same keys and short values), with the
document itself unchanged."""

from __future__ import annotations

import json

from bastion import interning
from bastion.interning import SHORT, interned
from bastion.jobspec import JobSpec, new_jobspec


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


def test_specs_asking_for_the_same_resources_share_one_dict(monkeypatch) -> None:
    monkeypatch.setattr(interning, "_shapes", {})

    def loaded(name: str, resources: dict[str, int]) -> JobSpec:
        spec = new_jobspec(
            name=name, command="true", resources=resources, user_id="u", project_id="p"
        )
        return JobSpec.loads(spec.dumps())

    a, b = loaded("a", {"cpu": 1}), loaded("b", {"cpu": 1})
    other = loaded("c", {"cpu": 2})
    assert a.metadata.resources == b.metadata.resources == {"cpu": 1}
    assert a.metadata.resources is b.metadata.resources
    assert other.metadata.resources == {"cpu": 2}
    assert other.metadata.resources is not a.metadata.resources
    monkeypatch.setattr(interning, "_MAX_SHARED", 2)  # past the bound: not kept, not shared
    assert (
        loaded("d", {"gpu": 1}).metadata.resources is not loaded("e", {"gpu": 1}).metadata.resources
    )
    assert len(interning._shapes) == 2
