"""Hostile input (issue 8, items 7, 9, 10, 12, 14): whatever a bucket writer or a quota file
contains, Bastion rejects it with a short reason; it never hangs, crashes, follows a link or
echoes megabytes back."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.bucket.store import Store, UnacceptableObject
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
    "a NUL in an environment variable's value": json.dumps(spec_dict(env_vars={"A": "x\u0000"})),
    "a NUL in an environment variable's name": json.dumps(spec_dict(env_vars={"A\u0000": "x"})),
    "a lone surrogate in an environment value": json.dumps(spec_dict(env_vars={"A": "\udc80"})),
    "a lone surrogate in an environment name": json.dumps(spec_dict(env_vars={"\udc80": "x"})),
    "a number as an environment value": json.dumps(spec_dict(env_vars={"A": 1})),
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


# -- items 9, 10, 12: a local root opens only regular files and follows no link -------------


def unblock(fifo: Path) -> None:
    """Open the FIFO's write end, so a reader stuck opening it goes on (and sees EOF)."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def finishes(call: Callable[[], object], fifo: Path | None = None, seconds: float = 10) -> object:
    """``call()``'s result or exception, failing the test if it blocks (on the old code a FIFO
    blocked its reader forever)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except Exception as e:
            box["value"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo:
            unblock(fifo)
        pytest.fail(f"blocked for {seconds}s")
    return box["value"]


@pytest.fixture
def hostile_root(tmp_path: Path) -> tuple[Store, Path]:
    """A local root whose jobs/active/ holds one good spec and every kind of non-file."""
    store = Store(str(tmp_path / "root"))
    active = tmp_path / "root" / "jobs" / "active"
    store.specs.submit("good", json.dumps(spec_dict(name="good")).encode())
    (active / "a-directory").mkdir()
    (active / "a-dangling-link").symlink_to(tmp_path / "nowhere")
    os.mkfifo(active / "a-fifo")
    (active / "a-link-to-a-directory").symlink_to(tmp_path)
    (tmp_path / "secret").write_text("SECRET-CONTENT")
    (active / "a-link-to-a-secret").symlink_to(tmp_path / "secret")
    (active / "too-big").write_bytes(b" " * (2 << 20))
    return store, active


def test_listing_names_every_entry_and_opens_none(hostile_root) -> None:
    store, active = hostile_root
    listed = finishes(store.specs.list, active / "a-fifo")
    assert sorted(listed) == sorted(os.listdir(active))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a-directory", "jobs/active/a-directory is a directory; specs must be regular files"),
        ("a-dangling-link", "jobs/active/a-dangling-link is a symbolic link; specs must be"),
        ("a-fifo", "jobs/active/a-fifo is a FIFO; specs must be regular files"),
        ("a-link-to-a-directory", "jobs/active/a-link-to-a-directory is a symbolic link;"),
        ("a-link-to-a-secret", "jobs/active/a-link-to-a-secret is a symbolic link; specs must"),
        ("too-big", "jobs/active/too-big is 2 MiB; the limit is 1 MiB"),
    ],
)
def test_reading_a_spec_that_is_no_regular_file_says_what_it_is(hostile_root, name, message):
    store, active = hostile_root
    error = finishes(lambda: store.specs.read(name), active / "a-fifo")
    assert isinstance(error, UnacceptableObject), error
    assert isinstance(error, ValueError) and str(error).startswith(message)
    assert len(str(error)) < 200


def test_a_spec_linked_to_dev_zero_is_refused_without_reading_it(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "root"))
    (tmp_path / "root" / "jobs" / "active" / "zero").symlink_to("/dev/zero")
    with pytest.raises(UnacceptableObject, match="is a symbolic link"):
        store.specs.read("zero")


def test_a_spec_over_the_limit_is_refused_with_its_size_on_every_backend(bastion) -> None:
    bastion.put("jobs", "active", "big", data=b"x" * ((1 << 20) + 1))
    bastion.put("jobs", "active", "empty", data=b"")
    with pytest.raises(UnacceptableObject, match=r"big is 1 MiB; the limit is 1 MiB"):
        bastion.store.specs.read("big")
    assert bastion.store.specs.read("empty") == b""
    assert bastion.store.specs.read("missing") is None


def test_a_250_character_name_gets_a_state_a_record_and_history(store: Store) -> None:
    name = "n" * 250
    token = store.states.write(name, b"{}")
    assert store.states.write(name, b"{}", token)
    store.complete.write(name, {"state": {}})
    store.history.save(name, "000-x", [{"event": "PENDING"}])
    store.logs.append(name, b"line\n")
    assert store.complete.read(name) == {"state": {}} and store.logs.read(name) == b"line\n"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "root"))


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """What a planted link points to: must never be written."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "file").write_text("untouched")
    return target


def test_a_link_planted_at_a_log_is_refused_not_followed(store: Store, tmp_path, elsewhere):
    (tmp_path / "root" / "logs").mkdir()
    (tmp_path / "root" / "logs" / "job").symlink_to(elsewhere / "file")
    with pytest.raises(UnacceptableObject, match="logs/job is a symbolic link"):
        store.logs.append("job", b"appended\n")
    assert (elsewhere / "file").read_text() == "untouched"


def test_a_link_planted_at_a_history_directory_is_refused(store: Store, tmp_path, elsewhere):
    (tmp_path / "root" / "history" / "jobs").mkdir(parents=True)
    (tmp_path / "root" / "history" / "jobs" / "job").symlink_to(elsewhere)
    with pytest.raises(UnacceptableObject, match="history/jobs/job is a symbolic link"):
        store.history.save("job", "file", [{"event": "x"}])
    with pytest.raises(UnacceptableObject):
        store.history.read("job").__next__()
    for parent in ("../../history/jobs/job", "../../history/jobs/./job"):
        with pytest.raises(UnacceptableObject):  # no delete through the link, nor out of it
            store.specs.delete(f"{parent}/file")
    assert os.listdir(elsewhere) == ["file"]
    assert (elsewhere / "file").read_text() == "untouched"


def test_a_link_planted_at_a_record_or_state_is_replaced_not_followed(
    store: Store, tmp_path, elsewhere
):
    states, complete = (
        tmp_path / "root" / "jobs" / "states",
        tmp_path / "root" / "jobs" / "complete",
    )
    (complete / "job").symlink_to(elsewhere / "file")
    (states / "job").symlink_to(elsewhere / "file")
    store.complete.write("job", {"state": {}})
    store.states.write("job", b"{}", store.states.list()["job"].token)
    assert not (complete / "job").is_symlink() and not (states / "job").is_symlink()
    assert (elsewhere / "file").read_text() == "untouched"


def test_a_link_planted_at_the_lock_is_refused(store: Store, tmp_path, elsewhere) -> None:
    (tmp_path / "root" / "jobs" / "states" / ".lock").symlink_to(elsewhere / "created")
    with pytest.raises(UnacceptableObject):
        store.states.write("job", b"{}")
    assert os.listdir(elsewhere) == ["file"]


def test_deleting_removes_a_link_or_directory_itself(hostile_root, elsewhere) -> None:
    store, active = hostile_root
    (active / "a-link-to-elsewhere").symlink_to(elsewhere)
    for name in os.listdir(active):
        store.specs.delete(name)
    assert os.listdir(active) == [] and os.listdir(elsewhere) == ["file"]


# -- item 9 (readers): one bad object never breaks `bastion list` ----------------------------


def plant_hostile_specs(root: Path, tmp_path: Path) -> list[str]:
    active = root / "jobs" / "active"
    Store(str(root))  # makes the layout
    (active / "a-directory").mkdir()
    os.mkfifo(active / "a-fifo")
    (active / "a-dangling-link").symlink_to(tmp_path / "nowhere")
    (active / "deep").write_text(deep(10_000))
    (active / "huge-int").write_text(
        json.dumps(spec_dict(name="huge-int")).replace('"version": 1', '"version": ' + "1" * 5000)
    )
    return sorted(os.listdir(active))


def test_list_shows_every_job_when_some_objects_are_hostile(local_bastion, tmp_path) -> None:
    local_bastion.cli("launch", "--name=good", "--", "true")
    root = Path(local_bastion.root)
    names = plant_hostile_specs(root, tmp_path)
    (root / "jobs" / "states" / "deep").write_text(deep(10_000))
    (root / "jobs" / "complete" / "broken").write_text("[1, 2")
    try:
        table = local_bastion.cli("list", "--all", timeout=30).stdout
        listed = json.loads(local_bastion.cli("list", "--all", "--json", timeout=30).stdout)
    finally:
        unblock(root / "jobs" / "active" / "a-fifo")
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert sorted(rows) == sorted([*names, "broken"])
    assert "SUBMITTED" in rows["good"]
    assert "is a FIFO" in rows["a-fifo"] and "is a directory" in rows["a-directory"]
    assert "symbolic link" in rows["a-dangling-link"] and "deeper than" in rows["deep"]
    assert "UNREADABLE" in rows["huge-int"] and "UNREADABLE" in rows["broken"]
    by_name = {job["name"]: job for job in listed}
    assert by_name["good"]["status"] == "SUBMITTED" and "problem" not in by_name["good"]
    assert all(by_name[n]["problem"] for n in names if n != "good")


def everything_under(root: Path) -> bytes:
    """The content of every regular file under ``root``, links not followed."""
    data = b""
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            if path.is_file() and not path.is_symlink():
                data += path.read_bytes()
    return data


def test_a_spec_linked_to_a_secret_never_has_the_secret_copied(local_bastion, tmp_path) -> None:
    (tmp_path / "secret").write_text("SECRET-CONTENT")
    link = Path(local_bastion.root, "jobs", "active", "leak")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(tmp_path / "secret")
    for _ in range(2):
        local_bastion.cli("start", "--once", f"--work_dir={local_bastion.work_dir}", check=False)
    assert b"SECRET-CONTENT" not in everything_under(Path(local_bastion.root))
    assert b"SECRET-CONTENT" not in everything_under(Path(local_bastion.work_dir))


def test_a_spec_that_is_no_regular_file_ends_rejected_with_what_it_is(local_bastion, tmp_path):
    """The daemon's part: UnacceptableObject or SpecError from a spec rejects it, once."""
    names = plant_hostile_specs(Path(local_bastion.root), tmp_path)
    local_bastion.start()
    try:
        for name in names:
            record = local_bastion.wait_complete(name, timeout=20)
            assert record["state"]["outcome"] == "REJECTED"
            assert len(record["state"]["reason"]) < 300
        assert local_bastion.listdir("jobs", "active") == []
    finally:
        unblock(Path(local_bastion.root, "jobs", "active", "a-fifo"))


def test_a_spec_file_named_in_bytes_that_are_not_utf8_is_rejected_in_the_daemons_log(
    local_bastion, tmp_path
) -> None:
    """A name like b'bad\\xff' is listed as 'bad\\udcff': the log file's handler failed on the
    surrogate ("--- Logging error --- UnicodeEncodeError") and the rejection line was lost,
    from the local file and from its mirror in the bucket."""
    Store(local_bastion.root)  # makes the layout
    active = os.path.join(os.fsencode(local_bastion.root), b"jobs", b"active")
    with open(os.path.join(active, b"bad\xff"), "wb") as f:
        f.write(json.dumps(spec_dict(name="bad")).encode())
    run = local_bastion.cli("start", "--once", f"--work_dir={local_bastion.work_dir}")
    assert "Logging error" not in run.stdout + run.stderr, run.stderr[-2000:]
    assert "UnicodeEncodeError" not in run.stdout + run.stderr
    line = "bad\\udcff: REJECTED: spec rejected: file name: job name 'bad\\udcff' is not a safe"
    logs = Path(local_bastion.work_dir, "logs")
    (local,) = [p for p in logs.glob("_bastion-*") if not p.name.endswith(".base")]
    assert line in local.read_text()
    (mirrored,) = [n for n in local_bastion.listdir("logs") if n.startswith("_bastion-")]
    assert line in (local_bastion.read("logs", mirrored) or b"").decode()
