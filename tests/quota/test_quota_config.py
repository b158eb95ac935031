"""The quota file: AXLearn's schema "1" unchanged, our [scheduling] table, every validation."""

from __future__ import annotations

import pytest

from quota.config import QuotaConfig, QuotaError, SchedulingKnobs, default_quota, parse_quota

AXLEARN = """
[toml-schema]
version = "1"
[total_resources]
v4 = 1024
[project_membership]
project1 = ["user1", "user2"]
project2 = ["user1", "user3"]
[project_resources.project1]
v4 = 0.6
[project_resources.project2]
v4 = 0.4
"""


def problems(text: str) -> list[str]:
    with pytest.raises(QuotaError) as e:
        parse_quota(text, "gs://b/quota.toml")
    assert all(p.startswith("gs://b/quota.toml: ") for p in e.value.problems)
    assert all("fix" in p for p in e.value.problems)
    return e.value.problems


def test_axlearn_file_loads_unchanged() -> None:
    c = parse_quota(AXLEARN, "q.toml")
    assert c.tiers == ({"v4": 1024},)
    assert c.pool == {"v4": 1024}
    assert c.membership == {"project1": ("user1", "user2"), "project2": ("user1", "user3")}
    assert c.shares == {
        "project1": {"v4": pytest.approx(0.6)},
        "project2": {"v4": pytest.approx(0.4)},
    }
    assert c.quota_of("project1") == {"v4": pytest.approx(614.4)}
    assert c.quota_of("project2") == {"v4": pytest.approx(409.6)}
    assert c.quota_of("nobody") == {}
    assert c.scheduling == SchedulingKnobs()
    assert c.notes == ()


def test_tiers_as_array_of_tables_sum_into_pool() -> None:
    text = AXLEARN.replace(
        "[total_resources]\nv4 = 1024",
        "[[total_resources]]\nv4 = 512\nv5 = 8\n[[total_resources]]\nv4 = 256",
    )
    c = parse_quota(text)
    assert c.tiers == ({"v4": 512, "v5": 8}, {"v4": 256})
    assert c.pool == {"v4": 768, "v5": 8}
    assert c.quota_of("project1") == {"v4": pytest.approx(0.6 * 768)}


def test_over_allocated_fractions_are_normalised_with_a_note() -> None:
    c = parse_quota(AXLEARN.replace("v4 = 0.4", "v4 = 0.8"))
    assert c.shares["project1"]["v4"] == pytest.approx(0.6 / 1.4)
    assert c.quota_of("project2")["v4"] == pytest.approx(0.8 / 1.4 * 1024)
    assert sum(c.quota_of(p)["v4"] for p in c.shares) == pytest.approx(1024)
    assert any("sum to 1.4" in n for n in c.notes)


def test_resource_missing_from_totals_is_tolerated() -> None:
    c = parse_quota(AXLEARN.replace("v4 = 0.6", "v4 = 0.6\nv3 = 1.0"))
    assert c.quota_of("project1") == {"v4": pytest.approx(614.4)}
    assert any("v3" in n and "ignored" in n for n in c.notes)


def test_membership_is_fullmatch_regex() -> None:
    text = AXLEARN.replace(
        'project1 = ["user1", "user2"]\nproject2 = ["user1", "user3"]',
        'team1 = ["user1"]\nteam2 = ["user[12]"]\nteam3 = [".*"]',
    )
    text = text.replace("project_resources.project1", "project_resources.team1")
    text = text.replace("project_resources.project2", "project_resources.team2")
    c = parse_quota(text)
    assert c.projects_of("user1") == ["team1", "team2", "team3"]
    assert c.projects_of("user2") == ["team2", "team3"]
    assert c.projects_of("user12") == ["team3"]
    assert c.is_member("user2", "team2") and not c.is_member("user12", "team2")


def test_project_ids_are_case_sensitive() -> None:
    c = parse_quota(
        AXLEARN.replace("project1 =", "Project1 =").replace(
            "project_resources.project1", "project_resources.Project1"
        )
    )
    assert c.projects_of("user2") == ["Project1"]
    assert c.quota_of("Project1") == {"v4": pytest.approx(614.4)}


def test_scheduling_knobs() -> None:
    c = parse_quota(
        AXLEARN
        + """
[scheduling]
min_runtime_seconds = 600
preemption_grace_seconds = 30.5
usage_half_life_seconds = 86400
preempt_within_project = true
reserve_after_seconds = 0
"""
    )
    assert c.scheduling == SchedulingKnobs(600.0, 30.5, 86400.0, True, 0.0)
    assert c.scheduling.reclaim_period_seconds == 630.5


def test_project_without_membership_is_noted() -> None:
    c = parse_quota(AXLEARN + "[project_resources.ghost]\nv4 = 0.0\n")
    assert any("ghost" in n and "nobody can submit" in n for n in c.notes)


def test_default_quota_gives_everyone_the_pool() -> None:
    c = default_quota({"cpu": 8, "gpu": 2})
    assert isinstance(c, QuotaConfig)
    assert c.pool == {"cpu": 8, "gpu": 2}
    assert c.quota_of("default") == {"cpu": 8.0, "gpu": 2.0}
    assert c.projects_of("anyone@example.com") == ["default"]


def test_toml_syntax_error_names_the_line() -> None:
    (p,) = problems(AXLEARN.replace("v4 = 0.6", "v4 = = 0.6"))
    assert "line 10" in p and "TOML syntax error" in p


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("v4 = 1024", "v4 = -1"), "[total_resources] v4: must be a whole number >= 0, got -1"),
        (("v4 = 1024", "v4 = 10.5"), "[total_resources] v4: must be a whole number >= 0, got 10.5"),
        (("v4 = 1024", 'v4 = "many"'), "[total_resources] v4: must be a whole number"),
        (("v4 = 1024", "v4 = true"), "[total_resources] v4: must be a whole number"),
        (("v4 = 0.6", "v4 = -0.6"), "[project_resources.project1] v4: fraction must be >= 0"),
        (("v4 = 0.6", 'v4 = "0.6"'), "[project_resources.project1] v4: fraction must be a number"),
        (("v4 = 0.6", "v4 = nan"), "[project_resources.project1] v4: fraction must be a number"),
        (('"user1", "user2"', '"user(1"'), "[project_membership] project1[0]: regular expression"),
        (('["user1", "user2"]', '"user1"'), "[project_membership] project1: must be a list"),
        (('version = "1"', 'version = "2"'), "[toml-schema] version: unsupported version '2'"),
        (('version = "1"', 'version = "1"\nflavour = 2'), "[toml-schema] flavour: unknown key"),
        (('[toml-schema]\nversion = "1"', ""), "[toml-schema]: missing"),
        (("[total_resources]\nv4 = 1024", ""), "[total_resources]: missing"),
        (("[total_resources]", "[total_resource]"), "[total_resource]: unknown table"),
        (
            ("[project_resources.project2]\nv4 = 0.4", "[project_resources]\nproject2 = 0.4"),
            "[project_resources] project2: must be a table",
        ),
    ],
)
def test_each_validation_error_names_key_and_fix(edit: tuple[str, str], expected: str) -> None:
    found = problems(AXLEARN.replace(*edit))
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "min_runtime_seconds = -5",
            "[scheduling] min_runtime_seconds: must be a number of seconds",
        ),
        ('preemption_grace_seconds = "1m"', "[scheduling] preemption_grace_seconds: must be"),
        ("usage_half_life_seconds = 0", "[scheduling] usage_half_life_seconds: must be > 0"),
        (
            "preempt_within_project = 1",
            "[scheduling] preempt_within_project: must be true or false",
        ),
        ("min_run_time = 5", "[scheduling] min_run_time: unknown key"),
    ],
)
def test_scheduling_validation(line: str, expected: str) -> None:
    found = problems(AXLEARN + "[scheduling]\n" + line + "\n")
    assert any(expected in p for p in found), found


def test_all_problems_are_collected_at_once() -> None:
    bad = AXLEARN.replace("v4 = 1024", "v4 = -1").replace("v4 = 0.6", "v4 = -0.6")
    bad = bad.replace('"user3"', '"(("') + "[scheduling]\nbogus = 1\n[extra]\n"
    found = problems(bad)
    assert len(found) == 5
    for needle in (
        "[total_resources] v4",
        "[project_resources.project1] v4",
        "[project_membership] project2",
        "[scheduling] bogus",
        "[extra]",
    ):
        assert any(needle in p for p in found), needle
