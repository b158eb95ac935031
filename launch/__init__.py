"""The client side of Bastion: build, submit, watch and tail jobs from Python."""

from bastion.jobspec import JobSpec, SpecError, new_jobspec
from bastion.jobstate import JobState, Outcome, Status
from launch.api import Client, JobExists, JobInfo, UnknownJob, default_user

__all__ = [
    "Client",
    "JobExists",
    "JobInfo",
    "JobSpec",
    "JobState",
    "Outcome",
    "SpecError",
    "Status",
    "UnknownJob",
    "default_user",
    "new_jobspec",
]
