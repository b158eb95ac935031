"""The ``bastion`` command: one verb per user action, flags in absl style (as AXLearn's).

    bastion start [--poll_seconds=S] [--once]
    bastion launch --name=N --project_id=P [--resources=v4=8,cpu=4] [--priority=3] -- CMD...
    bastion list [--all] [--json]        bastion logs NAME [--follow] [--exit_status]
    bastion cancel NAME [--force]        bastion history NAME
    bastion update NAME [--force] -- CMD...  bastion why NAME
    bastion quota check FILE             bastion simulate --quota_file=F --trace=T [--json]

Every verb takes --root (else $BASTION_ROOT, else a local directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Sequence

from absl import app, flags

from bastion.bucket.store import resolve_root
from bastion.jobspec import ExecLimitError, SpecError, parse_resources
from launch.api import (
    Client,
    JobExists,
    JobInfo,
    NoDaemon,
    NotOwner,
    UnknownJob,
    age_seconds,
    default_job_name,
    default_user,
    new_jobspec,
)
from launch.bundling import instance_type_runner, make_bundle
from launch.status import RootProblem, brief, check_root

# What a job without --resources (and without --instance_type) asks for, so that the quota,
# and the default one-project quota of the machine, meters it: one CPU.
DEFAULT_RESOURCES = {"cpu": 1}

FLAGS = flags.FLAGS
_ABSL_FLAGS = set(FLAGS)  # absl's own (--helpfull, --verbosity, ...): never checked per verb
flags.DEFINE_string(
    "root",
    None,
    "Bucket URL or directory holding Bastion's state "
    "(default: $BASTION_ROOT, else ~/.local/share/bastion).",
)
# launch / update
flags.DEFINE_string("name", None, "Job name (default: $USER-<6 hex>).")
flags.DEFINE_string("project_id", "default", "Project the job is charged to.")
flags.DEFINE_string("user_id", None, "User id (default: $BASTION_USER, else the login name).")
flags.DEFINE_bool(
    "force", False, "cancel/update: act on another user's job (the history names you both)."
)
flags.DEFINE_string(
    "resources", "", "Resources the job needs, all at once: TYPE=N,... (e.g. v4=8,cpu=4)."
)
flags.DEFINE_integer("priority", 5, "1 (highest) .. 5 (lowest).")
flags.DEFINE_multi_string("env", [], "KEY=VALUE environment variable for the job (repeatable).")
flags.DEFINE_string("cleanup_command", None, "Command run after the job ends, with its own log.")
flags.DEFINE_string(
    "runner", None, "launch: where the job runs: local, docker, ... (default: the daemon's)."
)
flags.DEFINE_string("image", None, "launch: container image for --runner=docker.")
flags.DEFINE_multi_string(
    "runner_option", [], "launch: KEY=VALUE option for the job's runner (repeatable)."
)
flags.DEFINE_string(
    "instance_type",
    None,
    "launch: tpu-<version>-<cores> (TPU slice) or gpu-<machine type> (GPU VM); sets the runner "
    "and the job's resources.",
)
flags.DEFINE_integer("num_replicas", 1, "launch: TPU slices for --instance_type=tpu-*.")
flags.DEFINE_bool("spot", False, "launch: ask for spot capacity for --instance_type.")
flags.DEFINE_string(
    "bundler",
    "tar",
    "launch/bundle: how the code travels: tar (default), docker, cloudbuild, none.",
)
flags.DEFINE_string("bundler_type", None, "launch/bundle: AXLearn's name for --bundler.")
flags.DEFINE_multi_string(
    "bundler_spec", [], "launch/bundle: KEY=VALUE option of the bundler (repeatable)."
)
flags.DEFINE_multi_string(
    "bundler_exclude", [], "launch/bundle: a path or glob left out of the bundle (repeatable)."
)
flags.DEFINE_string("source_dir", None, "launch/bundle: the directory bundled (default: cwd).")
flags.DEFINE_bool("dry_run", False, "launch: print the spec and its bundle; write nothing.")
# list / logs
flags.DEFINE_bool("all", False, "list: include completed jobs.")
flags.DEFINE_bool("json", False, "list/simulate: print JSON.")
flags.DEFINE_bool("follow", False, "logs/launch: keep printing until the job is finished.")
flags.DEFINE_bool("exit_status", False, "logs --follow: exit with the job's failure status.")
flags.DEFINE_string(
    "worker", None, "logs: one worker's own output (0, 1, ...) or 'all', every attempt."
)
flags.DEFINE_float("follow_poll_seconds", 1.0, "How often logs --follow polls the bucket.")
flags.DEFINE_float(
    "daemon_wait_seconds",
    30.0,
    "logs/launch --follow: give up (exit 1) after this long with no daemon acting on the root.",
)
# start
flags.DEFINE_float("poll_seconds", 3.0, "start: seconds between cycles.")
flags.DEFINE_bool("once", False, "start: run one cycle and exit (tests, cron).")
flags.DEFINE_string(
    "work_dir",
    None,
    "start: local directory for log mirrors and attempt "
    "files (default: ~/.local/state/bastion/<hash of root>).",
)
flags.DEFINE_float("grace_seconds", 30.0, "start: SIGTERM -> SIGKILL grace period on cancel.")
flags.DEFINE_float(
    "lease_seconds",
    60.0,
    "start: a second daemon on the same root takes over only after the holder's lease stayed "
    "unrenewed this long (0: no lease, for a root only one daemon will ever use).",
)
flags.DEFINE_string(
    "settings",
    None,
    "start: daemon settings TOML (default_runner, [runners.KIND] options; see the README).",
)
flags.DEFINE_string(
    "quota_file", None, "Quota TOML URL (default: ROOT/project-quotas/project-quotas.config)."
)
# vm
flags.DEFINE_string("vm_name", None, "vm: name of the VM that runs the daemon.")
flags.DEFINE_string("zone", None, "vm: Compute Engine zone, e.g. us-central1-a.")
flags.DEFINE_string("machine_type", "e2-standard-2", "vm create: machine type.")
flags.DEFINE_string("project", None, "vm: GCP project (default: that of the credentials).")
flags.DEFINE_string("service_account", None, "vm create: the VM's service account email.")
# simulate
flags.DEFINE_string("trace", None, "simulate: JSON-lines trace file.")
flags.DEFINE_string("events", None, "simulate: also write every decision as JSON lines here.")
OUR_FLAGS = set(FLAGS) - _ABSL_FLAGS


class UsageError(Exception):
    """Bad command line; printed with the verb's usage."""


def _client(reading: bool = True, name: str | None = None) -> Client:
    """The client of --root; RootProblem (one line) when the root is a file, unreachable or,
    for a verb that only reads (``reading``), does not exist (a typo'd --root). ``name``: the
    job the verb looks for, named in that line."""
    root = resolve_root(FLAGS.root)
    try:
        check_root(root, reading=reading)
    except RootProblem as e:
        raise RootProblem(f"no job {name!r}: {e}" if name else str(e)) from None
    return Client(root)


def _resources(text: str) -> dict[str, int]:
    """--resources, refusing a type given twice (``cpu=1,cpu=2``)."""
    seen: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key = item.partition("=")[0].strip()
        if key in seen:
            raise SpecError(
                f"resources: {key} is given twice ({seen[key]}, {item}); give each type once"
            )
        seen[key] = item
    return parse_resources(text)


def _command(args: Sequence[str], verb: str) -> str:
    if not args:
        raise UsageError(
            f"{verb}: give the command after --, e.g. bastion {verb} ... -- python train.py"
        )
    return args[0] if len(args) == 1 else shlex.join(args)


def _one_name(args: Sequence[str], verb: str) -> str:
    if len(args) != 1:
        raise UsageError(f"{verb}: give exactly one job name, e.g. bastion {verb} NAME")
    return args[0]


# -- verbs -----------------------------------------------------------------------------------


def cmd_start(args: Sequence[str]) -> int:
    from bastion.bucket.store import Store
    from bastion.daemon.start import start_daemon

    _no_args(args, "start")
    root = resolve_root(FLAGS.root)
    check_root(root, reading=False)
    if FLAGS.quota_file and Store(root).url_token(FLAGS.quota_file) is None:
        raise UnknownJob(
            f"no quota file at {FLAGS.quota_file}; fix --quota_file, or leave it out (the daemon "
            f"then reads {Store(root).default_quota_url()}, and without it runs one project "
            "'default' on this machine's pool)"
        )
    return start_daemon(
        root=root,
        work_dir=FLAGS.work_dir,
        quota_file=FLAGS.quota_file,
        poll_seconds=FLAGS.poll_seconds,
        once=FLAGS.once,
        grace_seconds=FLAGS.grace_seconds,
        lease_seconds=FLAGS.lease_seconds,
        settings_file=FLAGS.settings,
    )


def cmd_launch(args: Sequence[str]) -> int:
    env = {}
    for item in FLAGS.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env={item!r} is not KEY=VALUE")
        env[key] = value
    user = FLAGS.user_id or default_user()
    runner = _runner_object()
    resources = _resources(FLAGS.resources)
    if FLAGS.instance_type and runner and runner["kind"] in INSTANCE_TYPE_RUNNERS:
        # A runner that takes AXLearn's instance types itself (GKE: one JobSet of
        # num_replicas slices, or of num_replicas GPU hosts): the quota counts every replica.
        _, implied = instance_type_runner(FLAGS.instance_type, 1, FLAGS.spot)
        runner = {**runner, "instance_type": FLAGS.instance_type}
        if FLAGS.num_replicas > 1:
            runner["num_replicas"] = FLAGS.num_replicas
        if FLAGS.spot:
            runner["spot"] = True
        implied = {k: v * FLAGS.num_replicas for k, v in implied.items()}
        resources = {**implied, **resources}
    elif FLAGS.instance_type:
        if runner:
            raise UsageError(
                "--instance_type picks the runner: drop --runner/--image (or use "
                f"--runner={'/'.join(sorted(INSTANCE_TYPE_RUNNERS))}, which takes "
                "instance types)"
            )
        runner, implied = instance_type_runner(FLAGS.instance_type, FLAGS.num_replicas, FLAGS.spot)
        resources = {**implied, **resources}
    elif not resources and not FLAGS["resources"].present:
        resources = dict(DEFAULT_RESOURCES)
    spec = new_jobspec(
        name=FLAGS.name or default_job_name(user),
        command=_command(args, "launch"),
        user_id=user,
        project_id=FLAGS.project_id,
        resources=resources,
        priority=FLAGS.priority,
        cleanup_command=FLAGS.cleanup_command,
        env_vars=env or None,
        runner=runner,
        bundle=_bundle(dry_run=FLAGS.dry_run),
    )
    if FLAGS.dry_run:
        print(json.dumps(spec.to_json(), indent=1))
        return 0
    root = resolve_root(FLAGS.root)
    local = "://" not in root or root.startswith("file://")
    new_root = local and not os.path.isdir(root.removeprefix("file://"))
    client = _client(reading=False)
    if new_root:
        print(
            f"bastion: warning: {root} did not exist; created a new root there (check --root "
            "or $BASTION_ROOT if you meant an existing one)",
            file=sys.stderr,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said below, in the CLI's words
        client.submit(spec)
    print(f"submitted {spec.name} (job_id {spec.metadata.job_id}) to {client.store.root_url}")
    if spec.bundle:
        print(f"  code: {spec.bundle['kind']} bundle {spec.bundle['uri']}")
    print(f"  follow its log:  bastion logs {spec.name} --follow")
    status = client.daemon_status()
    if status.stopped:
        print(f"bastion: warning: {spec.name} waits: {status.message}", file=sys.stderr)
    if FLAGS.follow:
        return _follow(client, spec.name, exit_status=True)
    return 0


def _bundle(dry_run: bool) -> dict | None:
    return make_bundle(
        FLAGS.bundler_type or FLAGS.bundler,
        FLAGS.source_dir or os.getcwd(),
        resolve_root(FLAGS.root),
        FLAGS.bundler_spec,
        FLAGS.bundler_exclude,
        dry_run,
    )


def cmd_bundle(args: Sequence[str]) -> int:
    """Build (and upload or push) the bundle only; print its record."""
    _no_args(args, "bundle")
    check_root(resolve_root(FLAGS.root), reading=False)
    record = _bundle(dry_run=False)
    print(json.dumps(record, indent=1))
    return 0


INSTANCE_TYPE_RUNNERS = frozenset({"gke"})  # --runner=KIND that takes --instance_type itself


def _runner_object() -> dict[str, str] | None:
    """--runner, --image and --runner_option as the spec's ``runner`` object."""
    options: dict[str, str] = {}
    for item in FLAGS.runner_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--runner_option={item!r} is not KEY=VALUE")
        options[key] = value
    if FLAGS.image:
        options["image"] = FLAGS.image
    if not FLAGS.runner and not options:
        return None
    if not FLAGS.runner:
        raise UsageError("--image and --runner_option need --runner (e.g. --runner=docker)")
    return {"kind": FLAGS.runner, **options}


def cmd_list(args: Sequence[str]) -> int:
    from launch.why import quota_refusal

    _no_args(args, "list")
    client = _client()
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


def cmd_logs(args: Sequence[str]) -> int:
    name = _one_name(args, "logs")
    client = _client(name=name)
    if FLAGS.worker is not None:
        return _worker_logs(client, name)
    if FLAGS.follow:
        return _follow(client, name, exit_status=FLAGS.exit_status)
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


def _follow(client: Client, name: str, exit_status: bool) -> int:
    """Print the log until the job ends; with ``exit_status``, exit 0 only if it succeeded."""
    try:
        for text in client.follow_log(
            name,
            poll_seconds=FLAGS.follow_poll_seconds,
            no_daemon_timeout=FLAGS.daemon_wait_seconds,
        ):
            sys.stdout.write(text)
            sys.stdout.flush()
    except NoDaemon as e:
        print(f"bastion: error: {e}", file=sys.stderr)
        return 1
    info = client.get(name)
    if info.status == "SUCCEEDED":
        return 0
    if exit_status:
        print(
            f"bastion: {name} {info.status}" + (f": {info.reason}" if info.reason else ""),
            file=sys.stderr,
        )
        code = info.state.exit_code if info.state else None
        return code if code and 0 < code < 256 else 1
    return 0


def cmd_cancel(args: Sequence[str]) -> int:
    name = _one_name(args, "cancel")
    _client(name=name).cancel(name, FLAGS.user_id, force=FLAGS.force)
    print(f"cancel requested for {name}; the daemon stops it on its next cycle")
    return 0


def cmd_history(args: Sequence[str]) -> int:
    name = _one_name(args, "history")
    client = _client(name=name)
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


def cmd_update(args: Sequence[str]) -> int:
    if not args:
        raise UsageError("update: bastion update NAME -- NEW COMMAND")
    name, command = args[0], _command(args[1:], "update")
    spec = _client(name=name).update(name, command, FLAGS.user_id, force=FLAGS.force)
    print(
        f"updated {name} (version {spec.metadata.version}); a running attempt restarts with "
        "the new command"
    )
    return 0


def cmd_why(args: Sequence[str]) -> int:
    from launch.why import explain_job

    name = _one_name(args, "why")
    print(explain_job(_client(name=name), name, FLAGS.quota_file))
    return 0


def cmd_quota(args: Sequence[str]) -> int:
    from quota import commands

    if len(args) != 2 or args[0] != "check":
        raise UsageError("quota: bastion quota check FILE|ROOT")
    if _is_root(args[1]):
        return _check_root_quota(args[1])
    return commands.check(args[1], sys.stdout)


def _is_root(url: str) -> bool:
    """A directory, or a bucket prefix that is no object: a root, not a quota file."""
    import fsspec

    if "://" not in url or url.startswith("file://"):
        return os.path.isdir(url.removeprefix("file://"))
    fs, path = fsspec.core.url_to_fs(url)
    return not fs.isfile(path)


def _check_root_quota(root: str) -> int:
    """The quota file the daemon of ROOT reads: OK and its table, or every problem and what
    the daemon runs on instead (the last good version it kept)."""
    from launch.why import daemon_quota_url, quota_refusal
    from quota import commands

    check_root(root, reading=True)
    client = Client(root)
    url = daemon_quota_url(client)
    print(f"{root}: the daemon reads the quota file {url}")
    if client.store.url_token(url) is None:
        print(f"no quota file at {url}: the daemon runs one project 'default' on its pool")
        return 0
    code = commands.check(url, sys.stdout)
    refusal = quota_refusal(client, url)
    if refusal:
        print(refusal.splitlines()[0])
        last_good = client.store.read_last_good_quota()
        if last_good:
            from quota.config import parse_quota

            print(commands.quota_table(parse_quota(last_good, source="last good quota")))
    return code


def cmd_simulate(args: Sequence[str]) -> int:
    from quota import commands

    _no_args(args, "simulate")
    if not FLAGS.quota_file or not FLAGS.trace:
        raise UsageError("simulate: bastion simulate --quota_file=FILE --trace=FILE")
    return commands.simulate(
        FLAGS.quota_file, FLAGS.trace, FLAGS.poll_seconds, FLAGS.json, FLAGS.events, sys.stdout
    )


def cmd_vm(args: Sequence[str]) -> int:
    from bastion import vm

    if len(args) != 1 or args[0] not in ("create", "delete", "status"):
        raise UsageError("vm: bastion vm create|delete|status --vm_name=NAME --zone=ZONE")
    return vm.cli(
        args[0],
        root=resolve_root(FLAGS.root),
        name=FLAGS.vm_name,
        zone=FLAGS.zone,
        machine_type=FLAGS.machine_type,
        project=FLAGS.project,
        service_account=FLAGS.service_account,
        image=FLAGS.image,
        out=sys.stdout,
    )


def cmd_status(args: Sequence[str]) -> int:
    """Whether a daemon acts on the root: exit 0 if one holds its lease, 3 if none does."""
    _no_args(args, "status")
    status = _client(reading=False).daemon_status()
    print(status.message)
    return 3 if status.stopped else 0


def _no_args(args: Sequence[str], verb: str) -> None:
    if args:
        raise UsageError(f"{verb} takes no arguments, got {' '.join(args)!r}")


VERBS: dict[str, Callable[[Sequence[str]], int]] = {
    "start": cmd_start,
    "launch": cmd_launch,
    "bundle": cmd_bundle,
    "list": cmd_list,
    "logs": cmd_logs,
    "cancel": cmd_cancel,
    "history": cmd_history,
    "update": cmd_update,
    "why": cmd_why,
    "quota": cmd_quota,
    "simulate": cmd_simulate,
    "vm": cmd_vm,
    "status": cmd_status,
}


# -- usage: one short page per verb, its own flags only ------------------------------------

_LAUNCH_FLAGS = (
    "name",
    "project_id",
    "user_id",
    "resources",
    "priority",
    "env",
    "cleanup_command",
    "runner",
    "image",
    "runner_option",
    "instance_type",
    "num_replicas",
    "spot",
    "bundler",
    "bundler_type",
    "bundler_spec",
    "bundler_exclude",
    "source_dir",
    "dry_run",
    "follow",
    "follow_poll_seconds",
    "daemon_wait_seconds",
)
_BUNDLE_FLAGS = ("bundler", "bundler_type", "bundler_spec", "bundler_exclude", "source_dir")

# verb -> (usage, what it does, example, its flags besides --root)
USAGE: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "start": (
        "bastion start [flags]",
        "Run the daemon on the root (Ctrl-C stops it; running jobs are adopted by the next).",
        "bastion start --poll_seconds=1",
        (
            "poll_seconds",
            "once",
            "work_dir",
            "grace_seconds",
            "lease_seconds",
            "settings",
            "quota_file",
        ),
    ),
    "launch": (
        "bastion launch [flags] -- COMMAND...",
        "Bundle the current directory and submit a job that runs COMMAND in it. Without "
        "--resources a job asks for cpu=1.",
        "bastion launch --name=hello --resources=cpu=2 -- python train.py",
        _LAUNCH_FLAGS,
    ),
    "bundle": (
        "bastion bundle [flags]",
        "Build and upload the bundle of the current directory only; print its record.",
        "bastion bundle --bundler_exclude=data",
        _BUNDLE_FLAGS,
    ),
    "list": (
        "bastion list [--all] [--json]",
        "Active jobs (with --all, finished ones too): name, state, project, user, resources, "
        "priority, age, reason.",
        "bastion list --all",
        ("all", "json", "quota_file"),
    ),
    "logs": (
        "bastion logs NAME [--follow] [--exit_status] [--worker=K|all]",
        "A job's output (worker 0's, for a multi-host job); --follow prints lines as they are "
        "written until the job ends; --worker=K one worker's own output, --worker=all every "
        "worker's lines prefixed [a<attempt> w<worker>].",
        "bastion logs hello --follow",
        ("follow", "exit_status", "follow_poll_seconds", "daemon_wait_seconds", "worker"),
    ),
    "cancel": (
        "bastion cancel NAME",
        "Stop a job: SIGTERM to its process group, SIGKILL after the daemon's --grace_seconds. "
        "Another user's job needs --force.",
        "bastion cancel hello",
        ("user_id", "force"),
    ),
    "history": (
        "bastion history NAME",
        "A job's lifecycle events with their times and reasons.",
        "bastion history hello",
        (),
    ),
    "update": (
        "bastion update NAME -- NEW COMMAND...",
        "Give an active job a new command; a running attempt restarts with it. The job "
        "keeps its owner's identity; another user's job needs --force.",
        "bastion update train -- python train.py --resume",
        ("user_id", "force"),
    ),
    "why": (
        "bastion why NAME",
        "Why a job waits or runs: quota, usage, borrowing, its place in the queue.",
        "bastion why train",
        ("quota_file",),
    ),
    "quota": (
        "bastion quota check FILE|ROOT",
        "Check a quota file (every problem with its key, or the quota per project); for a "
        "root, the file its daemon reads and whether it runs on the last good version.",
        "bastion quota check configs/project-quotas.toml",
        (),
    ),
    "simulate": (
        "bastion simulate --quota_file=FILE --trace=FILE [--json]",
        "Replay a JSON-lines trace with the daemon's scheduling policy; print the metrics.",
        "bastion simulate --quota_file=configs/project-quotas.toml --trace=trace.jsonl",
        ("quota_file", "trace", "json", "events", "poll_seconds"),
    ),
    "vm": (
        "bastion vm create|delete|status --vm_name=NAME --zone=ZONE",
        "A Compute Engine VM that runs the daemon on the root.",
        "bastion vm create --vm_name=bastion-1 --zone=us-central1-a",
        ("vm_name", "zone", "machine_type", "project", "service_account", "image"),
    ),
    "status": (
        "bastion status",
        "Whether a daemon holds the root's lease (exit 0) or none does (exit 3).",
        "bastion status --root=gs://my-bucket/bastion",
        (),
    ),
}
COMMON_FLAGS = ("root",)


def usage(verb: str | None) -> str:
    if verb is None:
        lines = ["usage: bastion VERB [flags] [args]", "", "verbs:"]
        lines += [f"  {v:<9} {USAGE[v][1].split('. ')[0].rstrip('.')}" for v in USAGE]
        lines += [
            "",
            "Every verb takes --root=URL (else $BASTION_ROOT, else ~/.local/share/bastion).",
            "bastion VERB --help: that verb's flags and an example; --helpfull: every flag.",
        ]
        return "\n".join(lines)
    line, what, example, own = USAGE[verb]
    lines = [f"usage: {line}", "", what, "", "flags:"]
    for name in (*own, *COMMON_FLAGS):
        flag = FLAGS[name]
        default = "" if flag.default in (None, "", [], False) else f" (default {flag.default})"
        lines.append(f"  --{name}: {flag.help}{default}")
    lines += ["", f"example: {example}"]
    return "\n".join(lines)


_HELP = ("-h", "--help", "-help", "--h", "-?")


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with a short usage for --help/-h (exit 0) and one-line flag errors."""
    args = argv[1:]
    before = args[: args.index("--")] if "--" in args else args
    if any(a in _HELP for a in before) or before[:1] == ["help"]:
        verb = next((a for a in before if a in USAGE), None)
        print(usage(verb))
        sys.exit(0)
    if "--helpfull" in before:  # absl prints every flag, then exits 1; asking for help is no error
        with contextlib.suppress(SystemExit):
            FLAGS(argv)
        sys.exit(0)
    try:
        return FLAGS(argv)
    except flags.Error as e:
        verb = next((a for a in before if a in USAGE), None)
        see = f"bastion {verb} --help" if verb else "bastion --help"
        print(f"bastion: {e}; see {see}", file=sys.stderr)
        sys.exit(2)


def check_verb_flags(verb: str) -> None:
    """A flag given to a verb that does not take it is an error, never silently ignored."""
    allowed = {*USAGE[verb][3], *COMMON_FLAGS}
    for name in sorted(OUR_FLAGS):
        if FLAGS[name].present and name not in allowed:
            takers = [v for v in USAGE if name in USAGE[v][3]]
            hint = f" (it is a flag of: {', '.join(takers)})" if takers else ""
            raise UsageError(f"{verb} does not take --{name}{hint}; see bastion {verb} --help")


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[1] not in VERBS:
        got = f"unknown verb {argv[1]!r}; " if len(argv) >= 2 else ""
        print(f"bastion: {got}give a verb\n\n{usage(None)}", file=sys.stderr)
        return 2
    verb = argv[1]
    try:
        check_verb_flags(verb)
        return VERBS[verb](argv[2:])
    except UsageError as e:
        print(f"bastion: {e}", file=sys.stderr)
        return 2
    except NotOwner as e:  # refused before writing anything, as a usage error is
        print(f"bastion: error: {e.message('--force', '--user_id=')}", file=sys.stderr)
        return 2
    except ExecLimitError as e:  # what was typed can never start: a usage error, said at once
        print(f"bastion: error: {e}", file=sys.stderr)
        return 2
    except (SpecError, UnknownJob, JobExists, RootProblem, NoDaemon) as e:
        print(f"bastion: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except SystemExit:
        raise
    except Exception as e:  # one line, never a traceback; BASTION_DEBUG=1 shows it
        if os.environ.get("BASTION_DEBUG"):
            raise
        root = resolve_root(FLAGS.root)
        print(
            f"bastion: error: {verb} on {root}: {brief(e)} (BASTION_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


def run() -> None:
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
