"""The daemon keeps each job's last written state deflated (bastion/daemon/statebytes.py):
whatever the bytes, they come back exactly, and a typical state keeps in a fifth of its size."""

from __future__ import annotations

import os

from bastion.daemon.context import Job
from bastion.daemon.statebytes import squeeze, unsqueeze
from bastion.jobstate import JobState, Status


def _pending(name: str) -> bytes:
    state = JobState(status=Status.PENDING, reason="waiting for capacity: needs 1 cpu")
    state.job_identity = f"{name}-0bb18dc1-58bd-4945-9dcd-455a8f7e08af"
    return state.dumps()


def test_any_bytes_come_back_exactly():
    for raw in (b"", b"active\n", os.urandom(5000), _pending("a"), _pending("b") * 40):
        assert unsqueeze(squeeze(raw)) == raw


def test_a_typical_state_keeps_in_a_fifth_of_its_size():
    raw = _pending("j0001")
    assert len(squeeze(raw)) * 5 < len(raw), (len(squeeze(raw)), len(raw))


def test_a_job_holds_its_written_state_squeezed_and_gives_it_back_whole():
    raw = _pending("j0001")
    job = Job(name="j0001", state=JobState.loads(raw))
    assert job.written == b"" and not job.squeezed
    job.written = raw
    assert job.written == raw and job.squeezed == squeeze(raw) and len(job.squeezed) < len(raw)
    assert job.state.dumps() == job.written
