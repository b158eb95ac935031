"""The ledger's pure parts: a record from a state, merging records by attempt, sums over a
window, parsing an object with a torn line, and the usage verb's inputs (with their errors)."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from bastion.bucket.store import Store
from bastion.jobspec import new_jobspec
from bastion.jobstate import JobState, Outcome, Status
from bastion.usage.ledger import LedgerWriter, utc_day
from bastion.usage.records import attempt_record
from bastion.usage.report import merge, overlap, parse_lines, read_attempts, summarize
from launch.usage import UsageInputError, load_prices, parse_when, window

SPEC = new_jobspec(
    name="train", command="x", user_id="alice", project_id="research", resources={"gpu": 4}
)
T = 1_700_000_000.0


def _running(attempt: int = 1, borrowing: bool = False, **extra) -> JobState:
    why = "borrowing idle capacity: ..." if borrowing else "within quota: ..."
    started = {"time": T, "event": "STARTED", "attempt": attempt, "reason": f"started: {why}"}
    return JobState(
        status=Status.ACTIVE,
        attempt=attempt,
        submission="s1",
        start_time=T,
        tier=1,
        events=[started],
        **extra,
    )


def test_an_open_attempt_is_named_by_job_submission_and_attempt():
    record = attempt_record("train", SPEC, _running(borrowing=True))
    assert record is not None
    assert record["id"] == "train/s1/1" and record["kind"] == "open"
    assert record["project"] == "research" and record["user"] == "alice"
    assert record["resources"] == {"gpu": 4} and record["tier"] == 1 and record["borrowed"]


def test_a_reclaimed_attempt_ends_preempted_with_the_preemption_reason():
    state = _running()
    preempt = {"time": T + 50, "event": "PREEMPT", "attempt": 1, "reason": "reclaimed for a1"}
    requeued = {"time": T + 60, "event": "REQUEUED", "attempt": 1, "reason": "attempt 1 preempted"}
    state = JobState(
        **{
            **{k: getattr(state, k) for k in ("attempt", "submission", "start_time")},
            "status": Status.PENDING,
            "end_time": T + 60,
            "reason": "waiting for capacity",
            "events": [*state.events, preempt, requeued],
        }
    )
    record = attempt_record("train", SPEC, state, tier=1)
    assert record is not None and record["kind"] == "end"
    assert record["preempted"] and record["outcome"] == "PREEMPTED"
    assert record["reason"] == "reclaimed for a1" and record["tier"] == 1
    assert record["end"] == T + 60


def test_a_finished_attempt_keeps_its_outcome_and_is_not_preempted():
    state = _running()
    done = JobState(
        status=Status.COMPLETED,
        outcome=Outcome.FAILED,
        attempt=1,
        submission="s1",
        start_time=T,
        end_time=T + 10,
        reason="command exited with status 3",
        events=state.events,
    )
    record = attempt_record("train", SPEC, done)
    assert record is not None
    assert (record["outcome"], record["preempted"]) == ("FAILED", False)


def test_no_record_before_an_attempt_or_without_a_spec():
    assert attempt_record("train", SPEC, JobState()) is None
    assert attempt_record("train", None, _running()) is None


def test_merge_counts_an_attempt_once_whatever_the_duplicates():
    opened = attempt_record("train", SPEC, _running(borrowing=True))
    ended = {**opened, "kind": "end", "end": T + 100, "borrowed": False, "tier": None}
    attempts = merge([opened, opened, ended, opened, ended])  # restarts, retried appends
    (only,) = attempts.values()
    assert only.end == T + 100 and only.borrowed and only.tier == 1  # the open record's facts


def test_a_window_counts_the_part_of_each_attempt_inside_it():
    opened = attempt_record("train", SPEC, _running())
    ended = {**opened, "kind": "end", "end": T + 3600, "preempted": True, "outcome": "PREEMPTED"}
    attempts = merge([ended]).values()
    (row,) = summarize(attempts, "project", T + 1800, T + 7200, T + 7200)
    assert row.used == {"gpu": 4 * 1800} and row.lost == {"gpu": 4 * 1800}
    assert row.key == ("research",) and row.preempted == 1
    (row,) = summarize(attempts, "resource", T, T + 7200, T + 7200)
    assert row.key == ("gpu",) and row.used == {"gpu": 4 * 3600}
    assert summarize(attempts, "user", T + 3600, T + 7200, T + 7200) == []


def test_an_open_attempt_counts_until_now_and_loss_counts_from_the_checkpoint():
    opened = attempt_record("train", SPEC, _running())
    (row,) = summarize(merge([opened]).values(), "user", T - 10, T + 1e6, T + 600)
    assert row.key == ("research", "alice") and row.used == {"gpu": 4 * 600}
    ended = {**opened, "kind": "end", "end": T + 1000, "preempted": True, "checkpoint": T + 900}
    (row,) = summarize(merge([ended]).values(), "project", T, T + 2000, T + 2000)
    assert row.lost == {"gpu": 4 * 100} and row.used == {"gpu": 4 * 1000}


def test_borrowed_hours_are_those_of_attempts_admitted_beyond_quota():
    within = attempt_record("a", SPEC, _running())
    borrowed = attempt_record("b", SPEC, _running(borrowing=True))
    (row,) = summarize(merge([within, borrowed]).values(), "project", T, T + 10, T + 10)
    assert row.used == {"gpu": 80} and row.borrowed == {"gpu": 40}


def test_a_torn_last_line_loses_only_itself():
    good = json.dumps({"id": "a/s/1", "kind": "open", "start": T, "resources": {}})
    assert len(parse_lines(f'{good}\n{good}\n{{"id": "b'.encode())) == 2
    assert parse_lines(b"") == []
    assert overlap(0, 10, 5, 20) == 5 and overlap(0, 10, 20, 30) == 0


def test_the_writer_records_each_change_once_and_every_open_attempt_each_new_day(tmp_path):
    store = Store(str(tmp_path / "root"))
    writer = LedgerWriter("0123456789abcdef")
    job = ("train", SPEC, _running())
    writer.collect([job], [job], T)
    writer.collect([job], [job], T + 1)  # no change: nothing new
    assert writer.pending == 1
    assert writer.flush(store, T + 1)
    writer.collect([], [job], T + 86400)  # a new day: the open attempt again, in that day's object
    assert writer.flush(store, T + 86400)
    assert store.reports.usage_days() == [utc_day(T), utc_day(T + 86400)]
    one_day = read_attempts(store, T + 86400, T + 86400 + 60)
    assert list(one_day) == ["train/s1/1"]  # found without reading the day it started
    (row,) = summarize(one_day.values(), "project", T + 86400, T + 86460, T + 86460)
    assert row.used == {"gpu": 4 * 60}


def test_times_durations_and_their_errors_name_the_flag_and_the_forms():
    now = time.time()
    assert parse_when("since", "7d", now) == now - 7 * 86400
    assert parse_when("since", "90m", now) == now - 5400
    midnight = dt.datetime(2026, 11, 20, tzinfo=dt.UTC).timestamp()
    assert parse_when("until", "2026-11-20", now) == midnight
    assert parse_when("until", "2026-11-20T10:00", now) == midnight + 36000
    assert parse_when("until", str(midnight), now) == midnight
    with pytest.raises(UsageInputError, match=r"--until='soon' is not a time; give a duration"):
        parse_when("until", "soon", now)
    with pytest.raises(UsageInputError, match="is not after --since"):
        window("1h", "2h", now)


def test_a_price_table_with_a_bad_entry_names_the_file_the_key_and_the_fix(tmp_path):
    store = Store(str(tmp_path / "root"))
    good = tmp_path / "prices.toml"
    good.write_text('currency = "EUR"\n[prices]\ngpu = 2.5\n')
    assert load_prices(store, str(good)) == ({"gpu": 2.5}, "EUR")
    for text, message in (
        ("[prices]\ngpu = -1\n", "prices.gpu = -1 is not a price; give a number >= 0"),
        ("gpu = 1\n", "has no [prices] table"),
        ("[prices]\ngpu = 1\n[extra]\n", "unknown key(s) extra"),
        ("[prices\n", "is not TOML"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(UsageInputError) as e:
            load_prices(store, str(bad))
        assert message in str(e.value) and str(bad) in str(e.value), str(e.value)
