"""The client side of Bastion: build, submit, watch and tail jobs from Python."""

from bastion.jobspec import ExecLimitError, JobSpec, SpecError
from bastion.jobstate import JobState, Outcome, Status
from launch.api import (
    Client,
    JobExists,
    JobInfo,
    NoDaemon,
    NoDaemonWarning,
    NotOwner,
    UnknownJob,
    default_user,
    new_jobspec,
)

__all__ = [
    "Client",
    "ExecLimitError",
    "JobExists",
    "JobInfo",
    "JobSpec",
    "JobState",
    "NoDaemon",
    "NoDaemonWarning",
    "NotOwner",
    "Outcome",
    "SpecError",
    "Status",
    "UnknownJob",
    "default_user",
    "new_jobspec",
]
