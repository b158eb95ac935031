"""Verbs that read: list, logs, history, why (and the flags only they take)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

from absl import flags

from launch.api import (
    Client,
    JobInfo,
    age_seconds,
)
from launch.cli.common import FLAGS, UsageError, Verb, client_of, follow, no_args, one_name

flags.DEFINE_bool("all", False, "list: include completed jobs.")
flags.DEFINE_bool("exit_status", False, "logs --follow: exit with the job's failure status.")
flags.DEFINE_string(
    "worker", None, "logs: one worker's own output (0, 1, ...) or 'all', every attempt."
)


def cmd_list(args: Sequence[str]) -> int:
    from launch.why import quota_refusal

    no_args(args, "list")
    client = client_of()
    jobs = client.list_jobs(include_completed=FLAGS.all)
    notes = []
    status = client.daemon_status()
    if status.stopped:
        active = [j for j in jobs if not j.finished]
        notes.append(
            f"! {status.message}"
            + (
                f"; the {len(active)} unfinished job(s) below are not being run or watched"
                if active
                else ""
            )
        )
    refusal = quota_refusal(client, FLAGS.quota_file)
    if refusal:
        notes += ["! " + line for line in refusal.splitlines()]
    for note in notes:  # above the table on a terminal; stdout stays the table (or JSON)
        print(note, file=sys.stderr)
    sys.stderr.flush()
    if FLAGS.json:
        print(json.dumps([j.to_json() for j in jobs], indent=1))
        return 0
    rows = [("NAME", "STATE", "PROJECT", "USER", "RESOURCES", "PRI", "AGE", "REASON")]
    rows += [_row(j) for j in jobs]
    if any(j.workers for j in jobs):  # multi-host jobs: each worker's health, before REASON
        health = ["WORKERS"] + [j.worker_summary or "-" for j in jobs]
        rows = [(*r[:-1], w, r[-1]) for r, w in zip(rows, health, strict=True)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


def cmd_logs(args: Sequence[str]) -> int:
    name = one_name(args, "logs")
    client = client_of(name=name)
    if FLAGS.worker is not None:
        return _worker_logs(client, name)
    if FLAGS.follow:
        return follow(client, name, exit_status=FLAGS.exit_status)
    info = client.get(name)
    start = info.state.log_start if info.state else 0
    out = sys.stdout.buffer
    for chunk in client.iter_log(name, start):  # streamed: memory stays bounded
        out.write(chunk)
    out.flush()
    if info.finished and info.status == "REJECTED":
        print(f"[bastion] job {name} was rejected: {info.reason}")
    elif info.state is None:
        print(f"bastion: {name} has no output yet: {info.reason}", file=sys.stderr)
    return 0


def cmd_history(args: Sequence[str]) -> int:
    name = one_name(args, "history")
    client = client_of(name=name)
    for event in client.history(name):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(event["time"]))
        print(
            f"{stamp}Z  attempt {event.get('attempt', 0)}  {event['event']:<10} "
            f"{event.get('reason', '')}"
        )
    info = client.get(name)
    print(f"now: {info.status}" + (f" ({info.reason})" if info.reason else ""))
    bundle = info.spec.bundle if info.spec else None
    if bundle:
        commit, dirty = bundle.get("git_commit"), bundle.get("git_dirty")
        git = f", git {commit[:12]}{' (dirty)' if dirty else ''}" if commit else ""
        print(f"code: {bundle['kind']} {bundle['uri']} ({bundle['digest']}{git})")
    return 0


def cmd_why(args: Sequence[str]) -> int:
    from launch.why import explain_job

    name = one_name(args, "why")
    print(explain_job(client_of(name=name), name, FLAGS.quota_file))
    return 0


def _row(job: JobInfo) -> tuple[str, ...]:
    meta = job.spec.metadata if job.spec else None
    resources = ",".join(f"{k}={v}" for k, v in sorted(meta.resources.items())) if meta else ""
    reason = job.reason.replace("\n", " ")
    return (
        job.name,
        job.status,
        meta.project_id if meta else "?",
        meta.user_id if meta else "?",
        resources or "-",
        str(meta.priority) if meta else "?",
        _age(age_seconds(job)),
        reason if len(reason) <= 90 else reason[:89] + "…",
    )


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def _worker_logs(client: Client, name: str) -> int:
    """--worker=K|all: each worker's own output (a multi-host cloud job's agents write it)."""
    from launch.workers import parse_worker

    try:
        worker = parse_worker(FLAGS.worker)
    except ValueError as e:
        raise UsageError(str(e)) from None
    count = client.worker_count(name)
    if count == 0 and not FLAGS.follow:
        info = client.get(name)
        kind = (info.spec.runner_kind if info.spec else None) or "the daemon's default"
        if worker not in (None, 0):
            print(
                f"bastion: {name} has no output from worker {worker}: its attempts so far "
                f"wrote none (runner {kind}; a one-process job has only worker 0, "
                f"whose output is `bastion logs {name}`)",
                file=sys.stderr,
            )
            return 1
        FLAGS.worker = None
        return cmd_logs([name])  # one process: worker 0's output is the job's log
    if worker is not None and count and worker >= count and not FLAGS.follow:
        print(
            f"bastion: {name} has output from workers 0..{count - 1} only, not {worker}",
            file=sys.stderr,
        )
        return 1
    out = sys.stdout.buffer
    for data in client.worker_output(
        name, worker, follow=FLAGS.follow, poll_seconds=FLAGS.follow_poll_seconds
    ):
        out.write(data)
        out.flush()
    return 0


VERBS = (
    Verb(
        "list",
        cmd_list,
        "bastion list [--all] [--json]",
        (
            "Active jobs (with --all, finished ones too): name, state, project, user, resources, "
            "priority, age, reason."
        ),
        "bastion list --all",
        ("all", "json", "quota_file"),
    ),
    Verb(
        "logs",
        cmd_logs,
        "bastion logs NAME [--follow] [--exit_status] [--worker=K|all]",
        (
            "A job's output (worker 0's, for a multi-host job); --follow prints lines as they are"
            " written until the job ends; --worker=K one worker's own output, --worker=all every "
            "worker's lines prefixed [a<attempt> w<worker>]."
        ),
        "bastion logs hello --follow",
        ("follow", "exit_status", "follow_poll_seconds", "daemon_wait_seconds", "worker"),
    ),
    Verb(
        "history",
        cmd_history,
        "bastion history NAME",
        "A job's lifecycle events with their times and reasons.",
        "bastion history hello",
        (),
    ),
    Verb(
        "why",
        cmd_why,
        "bastion why NAME",
        "Why a job waits or runs: quota, usage, borrowing, its place in the queue.",
        "bastion why train",
        ("quota_file",),
    ),
)
