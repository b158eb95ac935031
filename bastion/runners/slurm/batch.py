"""What one attempt submits: the ``sbatch`` flags and the batch script. Pure functions.

Why apart: the submission is where the job's options, its quota tier and the settings meet
Slurm's flags (engines.md 4.2); it needs no cluster to build or test.

- *One job per attempt*: ``--job-name=<attempt name>``, ``--no-requeue`` (Bastion owns requeue:
  a preemption is a new attempt), a ``--comment`` naming root, runner, attempt and job.
- *Resources* are the job's totals over all nodes (as the quota meters them): ``gpu`` becomes
  ``--gres=gpu:<gpu/nodes>``, ``cpu`` ``--cpus-per-task=<cpu/nodes>``, ``memory`` (GiB)
  ``--mem=<memory/nodes>G``; runner option ``nodes`` (default 1) sets ``--nodes``.
- *Placement*: ``partition``, ``qos``, ``account`` from the settings, then the quota tier's
  (``tiers``), then the job's own options.
- *Warning signal*: ``--signal=B:TERM@<warn_seconds>`` (default 60): the batch shell forwards
  SIGTERM to the agents ``warn_seconds`` before the time limit (and at preemption where the
  cluster sets ``SlurmctldParameters=preempt_send_user_signal``), so each agent stops its
  command, flushes its output and writes its exit record before Slurm's SIGKILL.
- *Output* (``output``): ``bucket`` (default): one agent per node through ``srun`` reports
  output, heartbeats and exit records to the bucket (the compute nodes must reach it).
  ``shared_fs``: the command runs under ``srun`` with no agent, each task's output in
  ``<output_dir>/<attempt>.<task>.out`` (``--open-mode=append``), which the daemon reads by
  offset on the shared file system; exit codes come from Slurm.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from bastion.runners import startup
from bastion.runners.base import Attempt, RunnerError

OUTPUT_MODES = ("bucket", "shared_fs")
DEFAULT_WARN_SECONDS = 60
_RESOURCE_FLAGS = {"gpu": "gres", "cpu": "cpus-per-task", "memory": "mem"}
_PLACEMENT_KEYS = ("partition", "qos", "account")


def nodes_of(attempt: Attempt) -> int:
    """The runner option ``nodes`` (default 1), a positive whole number."""
    raw = attempt.options.get("nodes", 1)
    try:
        nodes = int(raw)
    except (TypeError, ValueError):
        nodes = 0
    if nodes < 1:
        raise RunnerError(f"runner option nodes = {raw!r} is not a positive whole number")
    return nodes


def parse_placement(said: str, where: str) -> dict[str, str]:
    """``"partition:high,qos:normal"`` as {partition: high, qos: normal}."""
    found = {}
    for item in said.split(","):
        key, sep, value = item.strip().partition(":")
        if not sep or key not in _PLACEMENT_KEYS or not value:
            raise RunnerError(
                f"runner slurm: {where} = {said!r}: give comma-separated "
                "partition:NAME, qos:NAME, account:NAME; fix the daemon's "
                "runner settings"
            )
        found[key] = value
    return found


def output_mode(settings: Mapping[str, Any]) -> str:
    """``bucket`` or ``shared_fs`` (with ``output_dir``); anything else is refused at once."""
    mode = str(settings.get("output") or "bucket")
    if mode not in OUTPUT_MODES:
        raise RunnerError(
            f"runner slurm: output = {mode!r}: use 'bucket' (the compute nodes reach the "
            "bucket) or 'shared_fs' (with output_dir on a file system the login node shares); "
            "fix [runners.slurm] output"
        )
    if mode == "shared_fs" and not settings.get("output_dir"):
        raise RunnerError(
            "runner slurm: output = 'shared_fs' needs output_dir, a directory on the shared "
            "file system that the compute nodes write and the daemon reads; set "
            "[runners.slurm] output_dir"
        )
    return mode


def warn_seconds(settings: Mapping[str, Any]) -> int:
    raw = settings.get("warn_seconds", DEFAULT_WARN_SECONDS)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise RunnerError(
            f"runner slurm: warn_seconds = {raw!r}: give whole seconds >= 0 before the time "
            "limit (0: no warning signal); fix [runners.slurm] warn_seconds"
        )
    return raw


def output_path(settings: Mapping[str, Any], attempt: str, task: int | str) -> str:
    """A task's output file in ``shared_fs`` mode (``%t`` for srun's own pattern)."""
    return f"{str(settings['output_dir']).rstrip('/')}/{attempt}.{task}.out"


def comment_for(attempt: Attempt, tag: str) -> str:
    """What the job is, in words Bastion reads back: root, runner, attempt name, job, number.
    Job names are safe identifiers (no spaces), so words split cleanly."""
    return (
        f"bastion-root={tag} bastion-runner=slurm bastion-attempt-name={attempt.name} "
        f"bastion-job={attempt.job} bastion-attempt={attempt.attempt} "
        f"bastion-nodes={nodes_of(attempt)}"
    )


def placement(
    attempt: Attempt, settings: Mapping[str, Any], tiers: Mapping[str, str]
) -> dict[str, str]:
    """partition, qos, account: the settings' defaults, then the tier's, then the job's."""
    found = {k: str(settings[k]) for k in _PLACEMENT_KEYS if settings.get(k)}
    if attempt.tier is not None and str(attempt.tier) in tiers:
        found.update(parse_placement(tiers[str(attempt.tier)], f"tiers.{attempt.tier}"))
    found.update({k: str(attempt.options[k]) for k in _PLACEMENT_KEYS if attempt.options.get(k)})
    return found


def sbatch_args(
    attempt: Attempt, settings: Mapping[str, Any], tiers: Mapping[str, str], tag: str
) -> list[str]:
    """Every ``sbatch`` flag for the attempt (the script goes to its stdin)."""
    nodes = nodes_of(attempt)
    args = [
        "--parsable",
        f"--job-name={attempt.name}",
        f"--comment={comment_for(attempt, tag)}",
        "--no-requeue",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--output={settings.get('slurm_output') or '/dev/null'}",
        "--open-mode=append",
    ]
    args += _resource_args(attempt, nodes)
    args += [f"--{k}={v}" for k, v in sorted(placement(attempt, settings, tiers).items())]
    limit = attempt.options.get("time") or settings.get("time")
    if limit:
        args.append(f"--time={limit}")
    if warn := warn_seconds(settings):
        args.append(f"--signal=B:TERM@{warn}")
    args += [str(a) for a in settings.get("sbatch_args") or []]
    return args


def _resource_args(attempt: Attempt, nodes: int) -> list[str]:
    args = []
    for resource, flag in _RESOURCE_FLAGS.items():
        total = attempt.resources.get(resource)
        if not total:
            continue
        if total % nodes:
            raise RunnerError(
                f"resources.{resource} = {total} does not divide among "
                f"{nodes} nodes (runner option nodes): give a multiple of "
                f"{nodes}"
            )
        each = total // nodes
        value = {"gres": f"gpu:{each}", "mem": f"{each}G"}.get(flag, str(each))
        args.append(f"--{flag}={value}")
    return args


def batch_script(attempt: Attempt, nodes: int, settings: Mapping[str, Any], root: str) -> str:
    """``srun`` of one task per node, under a batch shell that passes the warning signal on.

    ``--signal=B:TERM@<warn>`` reaches the batch shell ``warn`` seconds before the time limit
    (and at preemption where the cluster allows it); the shell passes SIGTERM to every task
    with ``scancel --signal=TERM`` (the job's steps only; srun itself would end the step on a
    SIGTERM instead of passing it on, so a ``kill`` of srun is only the fallback where the
    node has no ``scancel``): each agent stops its command (which may checkpoint on SIGTERM,
    as on a Spot VM), flushes its output and writes its exit record. The shell then waits for
    Slurm to end the job, so the time limit still ends it as TIMEOUT, the state the job's
    history must show. A task that fails ends the others (``--kill-on-bad-exit``), as one
    worker failing fails the job."""
    if output_mode(settings) == "shared_fs":
        task = _shared_fs_task(attempt, nodes)
        io = (
            f"--output={shlex.quote(output_path(settings, attempt.name, '%t'))} --open-mode=append "
        )
    else:
        task = _agent_task(attempt, nodes, settings, root)
        io = ""
    return (
        f"#!/bin/bash\n# bastion: attempt {attempt.name}, one task per node\n"
        f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 --nodes={nodes} {io}"
        f"bash -c {shlex.quote(task)} &\n"
        "step=$!\n"
        'trap \'scancel --signal=TERM "$SLURM_JOB_ID" || kill -TERM $step; wait $step; '
        "exec sleep infinity' TERM\n"
        "wait $step\n"
    )


def _agent_task(attempt: Attempt, nodes: int, settings: Mapping[str, Any], root: str) -> str:
    agent_args = [*map(str, settings.get("agent_args") or []), "--worker_env=SLURM_PROCID"]
    if attempt.bundle:
        agent_args.append(f"--bundle={json.dumps(dict(attempt.bundle), sort_keys=True)}")
    return startup.script(
        root=root,
        job=attempt.job,
        attempt=attempt.name,
        num_workers=nodes,
        command=attempt.command,
        env=attempt.env,
        python=str(settings.get("python") or sys.executable),
        package_url=settings.get("package_url"),
        agent_args=agent_args,
    )


def _shared_fs_task(attempt: Attempt, nodes: int) -> str:
    """The user's command with the job's environment and the worker's number, no agent: the
    compute nodes cannot reach the bucket, so there is no bundle to fetch either."""
    if attempt.bundle:
        raise RunnerError(
            "runner slurm: output = 'shared_fs' runs the command without the agent, which "
            "fetches bundles from the bucket; launch without a bundle (the code is on the "
            "shared file system) or use [runners.slurm] output = 'bucket'"
        )
    q = shlex.quote
    env = {
        **attempt.env,
        "BASTION_ATTEMPT_NAME": attempt.name,
        "BASTION_NUM_WORKERS": str(nodes),
    }
    lines = [f"export {k}={q(str(v))}" for k, v in sorted(env.items()) if k.isidentifier()]
    lines += ['export BASTION_WORKER="$SLURM_PROCID"', f"exec bash -c {q(attempt.command)}"]
    return "\n".join(lines) + "\n"
