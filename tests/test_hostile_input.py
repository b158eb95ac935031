"""Hostile input (issue 8, items 7, 9, 10, 12, 14): whatever a bucket writer or a quota file
contains, Bastion rejects it with a short reason; it never hangs, crashes, follows a link or
echoes megabytes back."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

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
