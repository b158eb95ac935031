"""Hostile input (issue 8, items 7, 9, 10, 12, 14): whatever a bucket writer or a quota file
contains, Bastion rejects it with a short reason; it never hangs, crashes, follows a link or
echoes megabytes back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.jobspec import JobSpec, SpecError, name_problem
from quota.config import QuotaError, parse_quota
from tests.harness import REPO

QUOTA = """
[toml-schema]
version = "1"
[total_resources]
v4 = 8
[project_membership]
team-a = {patterns}
[project_resources.team-a]
v4 = 1.0
"""


# -- item 7: membership patterns match in linear time ----------------------------------------


def test_a_backtracking_membership_pattern_matches_in_linear_time() -> None:
    """`(a+)+$` against 30 `a` and `!` took minutes with Python's re; in a subprocess so the old
    engine fails the test by its deadline instead of hanging the suite."""
    script = textwrap.dedent(
        f"""
        from quota.config import parse_quota
        config = parse_quota({QUOTA.format(patterns='["(a+)+$", "bob"]')!r}, "q.toml")
        user = "a" * 30 + "!"
        assert not config.is_member(user, "team-a")
        assert config.projects_of(user) == []
        assert config.projects_of("aaaa") == ["team-a"]
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=20
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("pattern", "what"),
    [(r"(a)\\1", "backreferences"), ("(?=a)a", "lookaround"), ("(?<!x)bob", "lookaround")],
)
def test_patterns_that_need_backtracking_are_rejected_naming_the_key(pattern, what) -> None:
    text = QUOTA.format(patterns=f'["alice", "{pattern}"]')
    with pytest.raises(QuotaError) as e:
        parse_quota(text, "gs://b/quota.toml")
    (problem,) = e.value.problems
    assert problem.startswith("gs://b/quota.toml: [project_membership] team-a[1]: ")
    assert what in problem and "fix:" in problem


def test_membership_stays_a_full_match_of_the_user_id() -> None:
    config = parse_quota(QUOTA.format(patterns='["user[12]", "team-.*"]'), "q.toml")
    assert config.is_member("user1", "team-a") and config.is_member("team-x", "team-a")
    assert not config.is_member("user12", "team-a") and not config.is_member("xuser1", "team-a")


# -- item 9: every spec either loads or is rejected with a short reason ----------------------


def spec_dict(**changes: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "version": 1,
        "name": "job",
        "command": "echo hi",
        "metadata": {
            "user_id": "u",
            "project_id": "p",
            "creation_time": "2026-01-01 12:00:00.000000",
            "resources": {"v4": 8},
        },
    }
    spec.update(changes)
    return spec


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def meta(**changes: object) -> dict[str, object]:
    return {**spec_dict()["metadata"], **changes}  # type: ignore[dict-item]


HOSTILE_SPECS = {
    "nested 10,000 levels": deep(10_000),
    "nested 10,000 levels in a field": json.dumps(spec_dict(extra="X")).replace(
        '"X"', deep(10_000)
    ),
    "nested 1,000 levels": deep(1_000),
    "an integer of 5,000 digits": json.dumps(spec_dict()).replace('"version": 1', "1" * 5000),
    "a priority of 5,000 digits": json.dumps(spec_dict(metadata=meta(priority="X"))).replace(
        '"X"', "9" * 5000
    ),
    "a count of 4,000 digits": json.dumps(spec_dict(metadata=meta(resources={"v4": "X"}))).replace(
        '"X"', "9" * 4000
    ),
    "a version of 4,000 digits": json.dumps(spec_dict(metadata=meta(version="X"))).replace(
        '"X"', "9" * 4000
    ),
    "a time past year 9999": json.dumps(
        spec_dict(metadata=meta(creation_time="9999-12-31T23:59:59-23:59"))
    ),
    "a time before year 1": json.dumps(
        spec_dict(metadata=meta(creation_time="0001-01-01T00:00:00+01:00"))
    ),
    "a NUL in the command": json.dumps(spec_dict(command="echo\u0000hi")),
    "a lone surrogate in the command": json.dumps(spec_dict(command="echo \ud800")),
    "an empty environment variable name": json.dumps(spec_dict(env_vars={"": "x"})),
    "'=' in an environment variable name": json.dumps(spec_dict(env_vars={"A=B": "x"})),
    "invalid UTF-8": b'{"version": 1, "name": "\xff"}',
    "over 1 MiB": json.dumps(spec_dict(command="x" * (1 << 20))),
    "a 2 MB name": json.dumps(spec_dict(name="n" * 2_000_000)),
    "Infinity as a count": json.dumps(spec_dict(metadata=meta(resources={"v4": float("inf")}))),
}


@pytest.mark.parametrize("raw", HOSTILE_SPECS.values(), ids=HOSTILE_SPECS)
def test_hostile_specs_are_rejected_with_a_short_reason(raw: str | bytes) -> None:
    with pytest.raises(SpecError) as e:
        JobSpec.loads(raw.encode() if isinstance(raw, str) else raw)
    assert 10 < len(str(e.value)) <= 300, str(e.value)


def test_a_spec_over_the_limit_is_rejected_with_its_size() -> None:
    raw = json.dumps(spec_dict(command="x" * (1 << 20))).encode()
    with pytest.raises(SpecError, match=f"spec is {len(raw):,} bytes; the limit is"):
        JobSpec.loads(raw)


def test_a_time_before_year_1000_round_trips() -> None:
    spec = JobSpec.loads(
        json.dumps(spec_dict(metadata=meta(creation_time="0042-01-01 00:00:00.000000")))
    )
    assert JobSpec.loads(spec.dumps()).digest() == spec.digest()


def test_nesting_within_the_bound_still_loads() -> None:
    spec = JobSpec.loads(json.dumps(spec_dict(runner={"kind": "docker", "opts": [[[[1]]]]})))
    assert spec.runner_options == {"opts": [[[[1]]]]}


ANY_CHARACTER = st.characters(blacklist_categories=())  # surrogates and NUL included
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(ANY_CHARACTER, max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(ANY_CHARACTER, max_size=8), inner)
    ),
    max_leaves=12,
)
FIELDS = ["version", "name", "command", "cleanup_command", "env_vars", "runner", "metadata"]
META_FIELDS = ["user_id", "project_id", "creation_time", "resources", "priority", "version"]
EXTREME_TIMES = st.sampled_from(["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-23:59"])
TIMES = (
    st.datetimes(timezones=st.none() | st.timezones()).map(str)
    | st.text(max_size=40)
    | EXTREME_TIMES
)
# JSON text json.dumps cannot write: deep nesting, integers past Python's digit limit
RAW = st.builds(deep, st.integers(0, 3000)) | st.builds(
    lambda digits, sign: sign + "9" * digits, st.integers(1, 6000), st.sampled_from(["", "-"])
)


class Raw(str):
    """A value written into the spec's JSON text as is."""


def loads_or_rejects(raw: bytes) -> None:
    """The property: SpecError, or a spec that serializes and loads back to the same job."""
    try:
        spec = JobSpec.loads(raw)
    except SpecError as e:
        assert len(str(e)) <= 1000
        return
    again = JobSpec.loads(spec.dumps())
    assert again.digest() == spec.digest()
    spec.validate()


@settings(max_examples=400, deadline=None)
@given(
    field=st.sampled_from(FIELDS + META_FIELDS + ["resources.v4", "env_vars.K", "extra"]),
    value=JSON | TIMES | RAW.map(Raw),
)
def test_any_json_in_any_field_loads_or_is_rejected(field: str, value: object) -> None:
    placeholder = "\ue000raw\ue000"
    shown = placeholder if isinstance(value, Raw) else value
    if field in META_FIELDS:
        spec = spec_dict(metadata=meta(**{field: shown}))
    elif field == "resources.v4":
        spec = spec_dict(metadata=meta(resources={"v4": shown}))
    elif field == "env_vars.K":
        spec = spec_dict(env_vars={"K": shown})
    else:
        spec = spec_dict(**{field: shown})
    text = json.dumps(spec, ensure_ascii=False)
    if isinstance(value, Raw):
        text = text.replace(json.dumps(placeholder, ensure_ascii=False), value)
    loads_or_rejects(text.encode(errors="surrogatepass"))


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_load_or_are_rejected(raw: bytes) -> None:
    loads_or_rejects(raw)


# -- item 14: a reason echoes a bounded part of what the user wrote --------------------------


def test_a_2_mb_name_gives_a_short_reason() -> None:
    problem = name_problem("n" * 2_000_000)
    assert problem is not None and len(problem) < 200 and "2000000 characters" in problem
    with pytest.raises(SpecError) as e:
        JobSpec.loads(json.dumps(spec_dict(name="é" * 2_000)).encode())
    assert len(str(e.value)) < 250


@pytest.mark.parametrize(
    "spec",
    [
        spec_dict(name="a b" * 100_000),
        spec_dict(command=["x" * 100_000]),
        spec_dict(env_vars={"K" * 100_000: 1}),
        spec_dict(env_vars={"K": ["v" * 100_000]}),
        spec_dict(version="9" * 100_000),
        spec_dict(runner={"kind": "k" * 100_000}),
        spec_dict(runner={"kind": "docker", "O" * 100_000: 1}),
        spec_dict(metadata=meta(resources={"r" * 100_000: -1})),
        spec_dict(metadata=meta(resources={"v4": "8" * 100_000})),
        spec_dict(metadata=meta(priority=9 * 10**4000)),
        spec_dict(metadata=meta(creation_time="t" * 100_000)),
        spec_dict(metadata=meta(user_id=["u" * 100_000])),
    ],
)
def test_every_echoed_value_is_bounded(spec: dict[str, object]) -> None:
    with pytest.raises(SpecError) as e:
        JobSpec.loads(json.dumps(spec).encode())
    assert len(str(e.value)) < 300, str(e.value)[:400]
