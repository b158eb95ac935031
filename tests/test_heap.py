"""The collector around a recovery (bastion/daemon/heap.py): paused while the daemon loads what
it holds, that frozen after (so later full collections skip it), and collectable again once
the daemon closes; never left paused, even when the recovery fails."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.daemon import heap, recovery
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
