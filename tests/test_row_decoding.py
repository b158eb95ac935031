"""A snapshot row's head (bastion/jobrow.py) and its standing (bastion/policy_inputs.py) are
read by every `bastion list` and `bastion why`, through orjson's decoder and checks written
for speed: they accept exactly what json's decoder and the row's field types accept, and
refuse the rest with ValueError (the reader then parses the job's own spec and state)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from bastion.jobrow import ROW_V3, JobRow
from bastion.policy_inputs import Standing
from quota.model import Phase

STANDING = ["PENDING", 1795697300.35, None, None, None, [], 0, None, None]
HEAD = [
    "PENDING",
    "PENDING",
    "waiting for capacity: needs 1 cpu",
    0,
    STANDING,
    "default",
    "bench",
    {"cpu": 1},
    5,
    "2026-11-26T12:48:18.545026Z",
    None,
    False,
]
SPEC_TEXT = '{"command": "true"}'


def row(head: list[Any]) -> bytes:
    return ROW_V3 + json.dumps(head).encode() + b"\n" + SPEC_TEXT.encode()


def with_field(index: int, value: Any) -> list[Any]:
    head = list(HEAD)
    head[index] = value
    return head


def test_a_row_reads_back_every_field_it_was_written_with() -> None:
    read = JobRow.loads(row(HEAD))
    assert (read.phase, read.status, read.reason, read.log_start) == tuple(HEAD[:4])
    assert (read.project_id, read.user_id, read.resources, read.priority) == tuple(HEAD[5:9])
    assert (read.creation_time, read.group, read.timed) == tuple(HEAD[9:])
    assert read.spec_json() == SPEC_TEXT and read.spec == {"command": "true"}
    assert read.standing == Standing.from_json(STANDING)
    assert read.standing.phase is Phase.PENDING


def test_what_orjson_refuses_and_json_takes_is_read_as_json_reads_it() -> None:
    big = 2**70  # past 64 bits: json.dumps writes it, orjson refuses it
    read = JobRow.loads(row(with_field(7, {"cpu": big})))
    assert read.resources == {"cpu": big}
    read = JobRow.loads(row(with_field(4, ["PENDING", math.nan, *STANDING[2:]])))
    assert math.isnan(read.standing_json[1])


@pytest.mark.parametrize(
    "raw",
    [
        ROW_V3 + b'["PENDING", "\xff"]\n{}',  # not UTF-8
        ROW_V3 + b"[1,2\n{}",  # torn
        ROW_V3 + json.dumps(HEAD[:-1]).encode() + b"\n{}",  # a field short
        ROW_V3 + json.dumps([*HEAD, 1]).encode() + b"\n{}",  # a field too many
    ],
)
def test_a_head_that_is_not_a_row_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        JobRow.loads(raw)


WRONG_TYPES = [
    (0, 1),  # phase
    (1, None),  # status
    (2, ["a"]),  # reason
    (3, "0"),  # log_start
    (3, True),  # log_start: a bool is not a count
    (5, 5),  # project_id
    (6, None),  # user_id
    (7, [1]),  # resources
    (9, 1795697300),  # creation_time
    (10, 3),  # group
    (11, 0),  # timed
]


@pytest.mark.parametrize(("index", "value"), WRONG_TYPES)
def test_a_row_with_a_field_of_the_wrong_type_is_refused(index: int, value: Any) -> None:
    with pytest.raises(ValueError, match="wrong type"):
        JobRow.loads(row(with_field(index, value)))


@pytest.mark.parametrize("at", [1, 2, 7, 8])  # submit, running, checkpoint, pending
@pytest.mark.parametrize("value", ["1795697300", [1.0], {}, True])
def test_a_standing_with_a_time_that_is_not_a_number_is_refused(at: int, value: Any) -> None:
    standing = list(STANDING)
    standing[at] = value
    with pytest.raises(ValueError, match="times are numbers"):
        Standing.from_json(standing)


@pytest.mark.parametrize("at", [1, 2, 7, 8])
@pytest.mark.parametrize("value", [None, 3, 2.5])
def test_a_standing_takes_a_time_as_none_an_int_or_a_float(at: int, value: Any) -> None:
    standing = list(STANDING)
    standing[at] = value
    assert Standing.from_json(standing).to_json()[at] == value
