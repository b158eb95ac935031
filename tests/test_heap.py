"""The collector around a recovery (bastion/heap.py): paused while the daemon loads what
it holds, that frozen after (so later full collections skip it), and collectable again once
the daemon closes; never left paused, even when the recovery fails. Paused, not frozen, while
`bastion list` and `bastion why` read the whole queue, and given back after."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion import heap
from bastion.bucket.store import Store
from bastion.daemon import recovery
from launch import api, why
from launch.api import Client, new_jobspec
from tests.test_quiet_periods import JOBS, Rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    gc.unfreeze()
    r = Rig(tmp_path)
    yield r
    r.daemon.close()
    gc.unfreeze()


def test_a_recovery_runs_with_the_collector_paused_and_freezes_what_it_loaded(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    recover = recovery.recover

    def watched(*args, **kwargs):  # a spy: what the collector was doing, then recovers
        seen.append(gc.isenabled())
        return recover(*args, **kwargs)

    monkeypatch.setattr(recovery, "recover", watched)
    rig.cycle()
    assert seen == [False] and gc.isenabled()
    assert gc.get_freeze_count() > 0
    rig.settle_in()
    assert len(rig.daemon.jobs) == JOBS
    rig.daemon.close()
    assert gc.get_freeze_count() == 0  # collectable again


class _Node:
    """A reference cycle: freed by a collection only."""

    def __init__(self) -> None:
        self.me = self


def test_jobs_taken_in_while_running_are_frozen_after_garbage_before_them_is_collected(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.settle_in()  # (its JOBS were taken in after the recovery of an empty root)
    monkeypatch.setattr(heap, "FREEZE_AFTER_JOBS", JOBS + 5)
    rig.submit([f"late{i}" for i in range(4)])  # JOBS + 4: nothing frozen yet
    frozen = gc.get_freeze_count()
    rig.cycle()
    assert len(rig.daemon.jobs) == JOBS + 4
    assert gc.get_freeze_count() <= frozen  # (frozen objects freed by their counts go)
    gc.disable()  # (only the daemon's settle may collect from here on)
    try:
        garbage = weakref.ref(_Node())
        assert garbage() is not None
        rig.submit(["late4", "late5"])  # JOBS + 6 since the last freeze
        rig.cycle()
        assert len(rig.daemon.jobs) == JOBS + 6
        assert gc.get_freeze_count() > frozen  # the new jobs' objects too
        assert garbage() is None  # collected, not frozen with them
        frozen = gc.get_freeze_count()
        rig.submit(["late6"])  # the count starts again from the freeze
        rig.cycle()
        assert gc.get_freeze_count() <= frozen
    finally:
        gc.enable()


def test_a_failed_recovery_leaves_the_collector_running(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(*_args, **_kwargs):
        raise OSError("a state could not be read")

    monkeypatch.setattr(recovery, "recover", unreadable)
    with pytest.raises(OSError):
        rig.cycle()
    assert gc.isenabled() and not rig.daemon.ctx.recovered


def test_a_paused_collector_is_left_paused() -> None:
    gc.disable()
    try:
        with heap.bulk_load():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        heap.thaw()


def spied(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[bool]:
    """Whether the collector ran each time ``module.name`` was called (a spy: it records,
    then calls the function itself)."""
    seen: list[bool] = []
    real = getattr(module, name)

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, watched)
    return seen


def test_a_list_of_the_queue_runs_with_the_collector_paused_and_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client(str(tmp_path / "root"), expect_daemon=False)
    for i in range(20):
        spec = new_jobspec(name=f"j{i:02d}", command="true", user_id="u", project_id="default")
        client.submit(spec)
    reads, placings = spied(monkeypatch, api, "read_active"), spied(monkeypatch, api, "placed")
    jobs = client.list_jobs()
    assert [j.name for j in jobs] == [f"j{i:02d}" for i in range(20)]
    assert reads == placings == [False] and gc.isenabled()


def test_why_reads_and_plans_the_queue_with_the_collector_paused_and_gives_it_back(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.settle_in()
    client = Client(store=Store(rig.root), expect_daemon=False)
    reads, plans = spied(monkeypatch, why, "read_active"), spied(monkeypatch, why, "explain")
    text = why.explain_job(client, "q029")
    assert text.startswith("job q029: WAIT") and "position:" in text
    assert reads == plans == [False] and gc.isenabled()


def test_a_paused_block_gives_the_collector_back_when_it_raises() -> None:
    with pytest.raises(OSError), heap.paused():
        assert not gc.isenabled()
        raise OSError("a read failed")
    assert gc.isenabled()
