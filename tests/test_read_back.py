"""``bastion.retry.read_back``: the one decision "was the lost answer ours", on its own and
through a real local bucket whose create meets its own first try."""

from __future__ import annotations

from pathlib import Path

from bastion.bucket.store import Store
from bastion.retry import read_back


def test_read_back_finds_our_own_write():
    back = read_back(lambda: b"ours", lambda found: found == b"ours")
    assert back.ours and not back.gone and back.found == b"ours"


def test_read_back_tells_someone_elses_write_from_ours():
    back = read_back(lambda: b"theirs", lambda found: found == b"ours")
    assert not back.ours and not back.gone and back.found == b"theirs"


def test_read_back_of_nothing_is_gone_and_never_ours():
    compared: list[object] = []
    back = read_back(lambda: None, lambda found: compared.append(found) or True)
    assert back.gone and not back.ours and back.found is None
    assert compared == []  # nothing there: nothing to compare, whatever the predicate says


def test_a_create_that_meets_its_own_first_try_succeeds(tmp_path: Path):
    """A bucket client retries a create whose answer was lost: the retry finds the same bytes
    (ours: True), while a create over other bytes is a conflict (False) and leaves them."""
    store = Store(str(tmp_path / "root"))
    assert store.specs.submit("job", b"spec one")
    assert store.specs.submit("job", b"spec one")  # the retry of our own create
    assert not store.specs.submit("job", b"spec two")  # someone else's name
    assert store.specs.read("job") == b"spec one"


def test_a_claim_retried_after_a_lost_answer_is_still_ours(tmp_path: Path):
    store = Store(str(tmp_path / "root"))
    record = {"host": "w0", "time": 1.0}
    assert store.agents.claim("job", "a1", 0, record)
    assert store.agents.claim("job", "a1", 0, record)  # same bytes: our own first try
    assert not store.agents.claim("job", "a1", 0, {**record, "host": "w1"})  # a second start
    assert store.agents.read("job", "a1", 0, "started") == record
