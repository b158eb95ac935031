"""Verbs that read: list, logs, history, why (and the flags only they take)."""

from __future__ import annotations

import concurrent.futures
import sys
import time
from collections.abc import Iterable, Sequence

from absl import flags

from bastion.timelimits import fmt_duration
from launch.api import (
    Client,
    JobInfo,
    age_seconds,
)
from launch.cli.common import (
    FLAGS,
    UsageError,
    Verb,
    client_of,
    filtered,
    follow,
    no_args,
    one_name,
)

flags.DEFINE_bool(
    "all", False, "Include completed jobs and every earlier run (for history: every run)."
)
flags.DEFINE_integer(
    "run", None, "One run of the name: 1.. from the oldest, 0 the latest, -1 the previous."
)
flags.DEFINE_bool("previous", False, "The run before the latest (--run=-1).")
flags.DEFINE_bool("exit_status", False, "With --follow: exit with the job's failure status.")
flags.DEFINE_string("worker", None, "One worker's own output (0, 1, ...) or 'all', every attempt.")


def cmd_list(args: Sequence[str]) -> int:
    from launch.why import quota_refusal

    no_args(args, "list")
    client = client_of()
    with concurrent.futures.ThreadPoolExecutor(1) as aside:
        daemon = aside.submit(client.daemon_status)  # its reads beside the list's
        jobs = client.list_jobs(include_completed=FLAGS.all or FLAGS.group is not None)
        status = daemon.result()
    project = FLAGS.project_id if FLAGS["project_id"].present else None
    jobs = filtered(jobs, FLAGS.group, FLAGS.state, FLAGS.user_id, project)
    notes = []
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
    if FLAGS.group is not None and not FLAGS.json:
        print(group_line(FLAGS.group, jobs))
        return 0
    runs = _earlier_runs(client, jobs) if FLAGS.all else {}
    if FLAGS.json:
        print(json_lines(j.json_text() for j in _with_runs(jobs, runs)))
        return 0
    _print_table(_with_runs(jobs, runs), numbered=bool(runs))
    return 0


def json_lines(texts: Iterable[str]) -> str:
    """A JSON array of these JSON texts, one per line: readable, grep-able (an indented dump
    goes through json's pure-Python encoder: 1.5 s for 10,000 jobs)."""
    return "[\n" + ",\n".join(texts) + "\n]"


def group_line(group: str, members: Sequence[JobInfo]) -> str:
    """``sweep1  sweep  100 jobs: 8 RUNNING, 80 PENDING, 12 SUCCEEDED``: a group at a
    glance, by the states its members show."""
    if not members:
        return f"{group}  no jobs in this group"
    counts: dict[str, int] = {}
    for job in members:
        shown = "RUNNING" if job.status == "ACTIVE" else job.status
        counts[shown] = counts.get(shown, 0) + 1
    kind = (members[0].spec.group or {}).get("kind", "array") if members[0].spec else "group"
    by_state = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda c: -c[1]))
    return f"{group}  {kind}  {len(members)} jobs: {by_state}"


def _earlier_runs(client: Client, jobs: Sequence[JobInfo]) -> dict[str, list[JobInfo]]:
    """Each name's finished runs before the one listed (a relaunched name's earlier runs)."""
    import concurrent.futures

    def earlier(job: JobInfo) -> list[JobInfo]:
        runs = client.runs(job.name)
        return [r.info for r in runs[:-1]]

    # A name run before has output before this run's (log_start > 0): only those are asked,
    # so a root of a thousand one-run names costs no extra request.
    rerun = [j for j in jobs if j.log_start > 0]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        found = dict(zip([j.name for j in rerun], pool.map(earlier, rerun), strict=True))
    return {name: infos for name, infos in found.items() if infos}


def _with_runs(jobs: Sequence[JobInfo], runs: dict[str, list[JobInfo]]) -> list[JobInfo]:
    out = []
    for job in jobs:
        out += runs.get(job.name, [])
        out.append(job)
    return out


def _print_table(jobs: Sequence[JobInfo], numbered: bool) -> None:
    rows = [("NAME", "STATE", "PROJECT", "USER", "RESOURCES", "PRI", "AGE", "REASON")]
    rows += [_row(j) for j in jobs]
    if numbered:  # list --all of relaunched names: which run each row is
        count: dict[str, int] = {}
        numbers = ["RUN"]
        for job in jobs:
            count[job.name] = count.get(job.name, 0) + 1
            numbers.append(str(count[job.name]))
        rows = [(r[0], n, *r[1:]) for r, n in zip(rows, numbers, strict=True)]
    lefts = [j.time_left() for j in jobs]
    if any(left is not None for left in lefts):  # time limits: what is left, before REASON
        column = ["LEFT"] + [fmt_duration(left) if left is not None else "-" for left in lefts]
        rows = [(*r[:-1], c, r[-1]) for r, c in zip(rows, column, strict=True)]
    if any(j.workers for j in jobs):  # multi-host jobs: each worker's health, before REASON
        health = ["WORKERS"] + [j.worker_summary or "-" for j in jobs]
        rows = [(*r[:-1], w, r[-1]) for r, w in zip(rows, health, strict=True)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])


def cmd_logs(args: Sequence[str]) -> int:
    name = one_name(args, "logs")
    client = client_of(name=name)
    if FLAGS.previous or FLAGS.run is not None:
        return _run_log(client, name)
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


def _run_log(client: Client, name: str) -> int:
    """logs --run=K / --previous: one run's output only."""
    if FLAGS.previous and FLAGS.run is not None:
        raise UsageError("give --run=K or --previous, not both (--previous is --run=-1)")
    if FLAGS.follow or FLAGS.worker is not None:
        raise UsageError("--run and --previous show a run's log; drop --follow and --worker")
    which = -1 if FLAGS.previous else FLAGS.run
    run = client.run(name, which)
    print(f"[bastion] run {run.number} of {name}: {run.info.status}", file=sys.stderr)
    out = sys.stdout.buffer
    for chunk in client.iter_run_log(name, which):
        out.write(chunk)
    out.flush()
    return 0


def outputs_line(summary: dict) -> str:
    """One attempt's outputs in the history: restored and synced bytes, and whether its final
    sync ran to its end."""
    worker = f" worker {summary.get('worker')}" if summary.get("worker") else ""
    worker += " (cleanup)" if summary.get("purpose") == "cleanup" else ""
    final = "" if summary.get("final") else " (no complete final sync)"
    return (
        f"outputs: attempt {summary.get('attempt', 0)}{worker} restored "
        f"{summary.get('restored_files', 0)} file(s), {summary.get('restored_bytes', 0)} bytes; "
        f"synced {summary.get('synced_files', 0)} file(s), {summary.get('synced_bytes', 0)} bytes "
        f"in {summary.get('requests', 0)} request(s){final}"
    )


def cmd_history(args: Sequence[str]) -> int:
    name = one_name(args, "history")
    client = client_of(name=name)
    for event in client.history(name, all_submissions=FLAGS.all):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(event["time"]))
        print(
            f"{stamp}Z  attempt {event.get('attempt', 0)}  {event['event']:<10} "
            f"{event.get('reason', '')}"
        )
    for summary in client.output_summaries(name):  # what each attempt's syncer moved
        print(outputs_line(summary))
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
    project, user, priority = (job.shown(k) for k in ("project_id", "user_id", "priority"))
    resources = ",".join(f"{k}={v}" for k, v in sorted((job.shown("resources") or {}).items()))
    reason = job.reason.replace("\n", " ")
    return (
        job.name,
        job.status,
        project if project is not None else "?",
        user if user is not None else "?",
        resources or "-",
        str(priority) if priority is not None else "?",
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
        "bastion list [--all] [--json] [--user_id=U] [--project_id=P] [--state=S] [--group=G]",
        (
            "Active jobs (with --all, finished ones and each earlier run of a name too): name, "
            "state, project, user, resources, priority, age, time left, reason. --group=G: "
            "the array or sweep as one line, its members counted by state."
        ),
        "bastion list --all",
        ("all", "json", "quota_file", "user_id", "project_id", "state", "group"),
    ),
    Verb(
        "logs",
        cmd_logs,
        "bastion logs NAME [--follow] [--exit_status] [--worker=K|all] [--run=K | --previous]",
        (
            "A job's output (worker 0's, for a multi-host job); --follow prints lines as they are"
            " written until the job ends; --worker=K one worker's own output, --worker=all every "
            "worker's lines prefixed [a<attempt> w<worker>]; --run=K one run of a relaunched "
            "name (1 the oldest, -1 the previous: also --previous)."
        ),
        "bastion logs hello --follow",
        (
            "follow",
            "exit_status",
            "follow_poll_seconds",
            "daemon_wait_seconds",
            "worker",
            "run",
            "previous",
        ),
    ),
    Verb(
        "history",
        cmd_history,
        "bastion history NAME [--all]",
        "A job's lifecycle events with their times and reasons; --all: every run of the name.",
        "bastion history hello",
        ("all",),
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
