"""Verbs that write: launch, bundle, update, cancel (and the flags only they take)."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Sequence

from absl import flags

from bastion.bucket.store import resolve_root
from bastion.jobspec import (
    JobSpec,
    SpecError,
    check_grace_seconds,
    check_stop_signal,
    parse_resources,
)
from bastion.timelimits import parse_time_limit
from launch import expand
from launch.api import (
    AlreadyFinished,
    Client,
    default_job_name,
    default_user,
    new_jobspec,
)
from launch.bundling import instance_type_runner, make_bundle
from launch.checks import Flags, refuse_mistakes
from launch.cli.check import launch_check
from launch.cli.common import (
    FLAGS,
    UsageError,
    Verb,
    client_of,
    command_of,
    filtered,
    follow,
    no_args,
)
from launch.status import check_root
from launch.submitting import SubmitRefused

flags.DEFINE_string("name", None, "Job name (default: $USER-<6 hex>).")
flags.DEFINE_bool("force", False, "Act on another user's job (the history names you both).")
flags.DEFINE_string(
    "resources", "", "Resources the job needs, all at once: TYPE=N,... (e.g. v4=8,cpu=4)."
)
flags.DEFINE_integer("priority", 5, "1 (highest) .. 5 (lowest).")
flags.DEFINE_multi_string("env", [], "KEY=VALUE environment variable for the job (repeatable).")
flags.DEFINE_string(
    "stop_signal",
    None,
    "The signal that warns the job before a stop (TERM, INT, HUP, QUIT, USR1, USR2; "
    "default TERM); SIGKILL follows after --grace_seconds.",
)
flags.DEFINE_string("cleanup_command", None, "Command run after the job ends, with its own log.")
flags.DEFINE_string(
    "runner", None, "Where the job runs: local, docker, ... (default: the daemon's)."
)
flags.DEFINE_multi_string(
    "runner_option", [], "KEY=VALUE option for the job's runner (repeatable)."
)
flags.DEFINE_string(
    "instance_type",
    None,
    "tpu-<version>-<cores> (TPU slice) or gpu-<machine type> (GPU VM); sets the runner "
    "and the job's resources.",
)
flags.DEFINE_integer("num_replicas", 1, "TPU slices for --instance_type=tpu-*.")
flags.DEFINE_bool("spot", False, "Ask for spot capacity for --instance_type.")
flags.DEFINE_string(
    "bundler",
    "tar",
    "How the code travels: tar (default), docker, cloudbuild, none.",
)
flags.DEFINE_string("bundler_type", None, "AXLearn's name for --bundler.")
flags.DEFINE_multi_string("bundler_spec", [], "KEY=VALUE option of the bundler (repeatable).")
flags.DEFINE_multi_string(
    "bundler_exclude", [], "A path or glob left out of the bundle (repeatable)."
)
flags.DEFINE_string("source_dir", None, "The directory bundled (default: cwd).")
flags.DEFINE_bool("dry_run", False, "Print the spec and its bundle; write nothing.")
flags.DEFINE_bool(
    "check",
    False,
    "Check the job against the root's daemon (runner, project, membership, resources, bundle "
    "size) and say what it would wait for; submit nothing.",
)
flags.DEFINE_string(
    "time",
    None,
    "Time limit of running time, as sbatch takes it (2h, 90m, 1-00:00:00, HH:MM:SS); "
    "stopped at it (the stop signal, the grace, then SIGKILL) and ends TIMEOUT.",
)
flags.DEFINE_string(
    "after", None, "NAME[,NAME...]: wait until these jobs succeed (else end CANCELLED)."
)
flags.DEFINE_string(
    "after_any", None, "NAME[,NAME...]: wait until these jobs end, however they end."
)
flags.DEFINE_string(
    "array",
    None,
    "A group of jobs NAME-I, one per index: 0-99, 0-99%8 (at most 8 at once), 1,3,5, "
    "0-9:2; each gets $BASTION_ARRAY_INDEX.",
)
flags.DEFINE_string("sweep", None, "A sweep file (TOML: [axes] or [[points]]): one job per point.")
flags.DEFINE_bool(
    "retry_failed", False, "With --group=G: submit again the members of G that FAILED/TIMEOUT."
)


DEFAULT_RESOURCES = {"cpu": 1}


INSTANCE_TYPE_RUNNERS = frozenset({"gke"})


def cmd_launch(args: Sequence[str]) -> int:
    if FLAGS.retry_failed or FLAGS.group:
        return _retry_failed(args)
    if not FLAGS.dry_run:  # an unreachable root is said within the probe's bound, before bundling
        check_root(resolve_root(FLAGS.root), reading=FLAGS.check)
    user = FLAGS.user_id or default_user()
    runner, resources = _placement()
    spec = new_jobspec(
        name=FLAGS.name or default_job_name(user),
        command=command_of(args, "launch"),
        user_id=user,
        project_id=FLAGS.project_id,
        resources=resources,
        priority=FLAGS.priority,
        cleanup_command=FLAGS.cleanup_command,
        env_vars=_env() or None,
        runner=runner,
        bundle=_bundle(dry_run=FLAGS.dry_run or FLAGS.check),
        **_scheduling(),
    )
    specs = _members(spec)
    if FLAGS.follow and spec.group:
        raise UsageError("--follow follows one job; a group: bastion list --group=NAME")
    if FLAGS.check:
        return launch_check(spec, FLAGS.instance_type)
    if FLAGS.dry_run:
        one = len(specs) == 1 and not spec.group
        print(json.dumps(spec.to_json() if one else [s.to_json() for s in specs], indent=1))
        return 0
    client = _launch_client()
    refuse_mistakes(client.store, spec, Flags(FLAGS.instance_type))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said below, in the CLI's words
        if len(specs) == 1 and not spec.group:
            try:
                client.submit(spec)
            except SubmitRefused as e:  # a dependency missing or a cycle: nothing written
                raise UsageError(f"error: {e}") from None
        else:
            _submit_group(client, specs)
    if len(specs) == 1:
        print(f"submitted {spec.name} (job_id {spec.metadata.job_id}) to {client.store.root_url}")
    if spec.bundle:
        print(f"  code: {spec.bundle['kind']} bundle {spec.bundle['uri']}")
    if len(specs) == 1:
        print(f"  follow its log:  bastion logs {spec.name} --follow")
    _warn_if_no_daemon(client, spec.name)
    if FLAGS.follow and len(specs) == 1:
        return follow(client, spec.name, exit_status=True)
    return 0


def _env() -> dict[str, str]:
    env = {}
    for item in FLAGS.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env={item!r} is not KEY=VALUE")
        env[key] = value
    return env


def _placement() -> tuple[dict | None, dict[str, int]]:
    """--runner/--image/--runner_option, --instance_type and --resources as the spec's
    runner object and resources."""
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
    return runner, resources


def _scheduling() -> dict:
    """--time, --after, --after_any, --stop_signal and --grace_seconds as spec fields; a
    malformed one is a usage error (exit 2) that names the flag and the forms it takes."""
    if FLAGS.after and FLAGS.after_any:
        raise UsageError("give --after or --after_any, not both (one kind of wait per job)")
    fields: dict = {}
    try:
        fields["stop_signal"] = check_stop_signal(FLAGS.stop_signal, "--stop_signal")
        fields["grace_seconds"] = check_grace_seconds(FLAGS.grace_seconds, "--grace_seconds")
        if FLAGS.time is not None:
            fields["time_limit"] = parse_time_limit(FLAGS.time, "--time")
        names = FLAGS.after or FLAGS.after_any
        if names is not None:
            fields["after"] = [n.strip() for n in names.split(",") if n.strip()]
            fields["after_any"] = bool(FLAGS.after_any)
            if not fields["after"]:
                raise SpecError(f"--after: {names!r} names no job; give NAME[,NAME...]")
    except SpecError as e:
        raise UsageError(str(e)) from None
    return fields


def _members(spec: JobSpec) -> list[JobSpec]:
    """The spec, or one per member of --array or --sweep (a bad range or sweep file is a
    usage error, exit 2, naming the flag or file, the key and the fix)."""
    if FLAGS.array is not None and FLAGS.sweep is not None:
        raise UsageError("give --array or --sweep, not both: a group is one or the other")
    try:
        if FLAGS.array is not None:
            return expand.expand(spec, expand.parse_array(FLAGS.array))
        if FLAGS.sweep is not None:
            return expand.expand(spec, expand.load_sweep(FLAGS.sweep))
    except SpecError as e:
        raise UsageError(str(e)) from None
    return [spec]


def _launch_client() -> Client:
    root = resolve_root(FLAGS.root)
    local = "://" not in root or root.startswith("file://")
    new_root = local and not os.path.isdir(root.removeprefix("file://"))
    # A bucket root was probed at the start of launch, before bundling: a second probe here
    # only doubled the wait (and the chance a busy bucket misses the bound).
    client = client_of(reading=False) if local else Client(root)
    if new_root:
        print(
            f"bastion: warning: {root} did not exist; created a new root there (check --root "
            "or $BASTION_ROOT if you meant an existing one)",
            file=sys.stderr,
        )
    return client


def _submit_group(client: Client, specs: list[JobSpec]) -> None:
    started = time.monotonic()
    try:
        client.submit_group(specs)
    except SpecError as e:  # a name taken, a dependency missing: nothing written
        raise UsageError(f"error: {e}") from None
    group = specs[0].group or {}
    limit = group.get("max_running")
    print(
        f"submitted group {group.get('name')}: {len(specs)} jobs {specs[0].name} .. "
        f"{specs[-1].name}"
        + (f", at most {limit} at once" if limit else "")
        + f" to {client.store.root_url} in {time.monotonic() - started:.1f}s"
    )
    print(f"  see it:  bastion list --group={group.get('name')}")


def _warn_if_no_daemon(client: Client, name: str) -> None:
    status = client.daemon_status()
    if status.stopped:
        print(f"bastion: warning: {name} waits: {status.message}", file=sys.stderr)


def _retry_failed(args: Sequence[str]) -> int:
    """launch --group=G --retry_failed: the failed members again, nothing else."""
    if not (FLAGS.retry_failed and FLAGS.group):
        raise UsageError("--group and --retry_failed go together: launch --group=G --retry_failed")
    no_args(args, "launch --retry_failed")
    client = client_of(name=FLAGS.group)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        specs = client.retry_failed(FLAGS.group)
    if not specs:
        print(f"no member of {FLAGS.group} failed; nothing submitted")
        return 0
    print(
        f"resubmitted {len(specs)} failed member(s) of {FLAGS.group}: "
        + ", ".join(s.name for s in specs[:10])
        + (" ..." if len(specs) > 10 else "")
    )
    _warn_if_no_daemon(client, FLAGS.group)
    return 0


def cmd_bundle(args: Sequence[str]) -> int:
    """Build (and upload or push) the bundle only; print its record."""
    no_args(args, "bundle")
    check_root(resolve_root(FLAGS.root), reading=False)
    record = _bundle(dry_run=False)
    print(json.dumps(record, indent=1))
    return 0


def cmd_update(args: Sequence[str]) -> int:
    if not args:
        raise UsageError("update: bastion update NAME -- NEW COMMAND")
    name, command = args[0], command_of(args[1:], "update")
    spec = client_of(name=name).update(name, command, FLAGS.user_id, force=FLAGS.force)
    print(
        f"updated {name} (version {spec.metadata.version}); a running attempt restarts with "
        "the new command"
    )
    return 0


def cmd_cancel(args: Sequence[str]) -> int:
    """One job by name; several names; or every job a filter picks (--group, --state,
    --project_id), asking first when it is more than one (--yes: do not ask)."""
    filtering = FLAGS.group or FLAGS.state or FLAGS["project_id"].present
    if not args and not filtering:
        raise UsageError("cancel: give job names, or a filter (--group, --state, --project_id)")
    client = client_of(name=args[0] if len(args) == 1 else None)
    names = list(args) if args else _picked(client)
    if not names:
        print("no active job matches; nothing cancelled")
        return 0
    if len(names) > 1 and not FLAGS.yes:
        _confirm(names)
    cancel_each(client, names, FLAGS.user_id, FLAGS.force, named=bool(args))
    return 0


def cancel_each(
    client: Client, names: Sequence[str], user_id: str | None, force: bool, named: bool
) -> None:
    """Ask for each cancel in turn. A job a filter picked (``named`` False) may finish
    between the listing and its cancel (a sweep's short jobs do): it is said so and passed
    over, and the others are still cancelled; a job named on the command line that has
    finished is an error, as for one name."""
    for name in names:
        try:
            client.cancel(name, user_id, force=force)
        except AlreadyFinished as e:
            if named:
                raise
            print(f"{name} finished meanwhile ({e.status}); nothing to cancel")
            continue
        print(f"cancel requested for {name}; the daemon stops it on its next cycle")


def _picked(client: Client) -> list[str]:
    """Active jobs the filter picks: yours (who --user_id says, else you), or anyone's with
    --force."""
    who = FLAGS.user_id or default_user()
    project = FLAGS.project_id if FLAGS["project_id"].present else None
    jobs = filtered(client.list_jobs(), FLAGS.group, FLAGS.state, project_id=project)
    return [j.name for j in jobs if FLAGS.force or (j.spec and j.spec.metadata.user_id == who)]


def _confirm(names: list[str]) -> None:
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    if not sys.stdin.isatty():
        raise UsageError(
            f"cancel: this would cancel {len(names)} jobs ({shown}) and stdin is no terminal "
            "to ask on; pass --yes to cancel them all"
        )
    answer = input(f"cancel {len(names)} jobs ({shown})? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("cancel: not confirmed; nothing cancelled")


def _bundle(dry_run: bool) -> dict | None:
    return make_bundle(
        FLAGS.bundler_type or FLAGS.bundler,
        FLAGS.source_dir or os.getcwd(),
        resolve_root(FLAGS.root),
        FLAGS.bundler_spec,
        FLAGS.bundler_exclude,
        dry_run,
    )


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


VERBS = (
    Verb(
        "launch",
        cmd_launch,
        "bastion launch [flags] -- COMMAND... | bastion launch --group=G --retry_failed",
        (
            "Bundle the current directory and submit a job that runs COMMAND in it. Without "
            "--resources a job asks for cpu=1."
        ),
        "bastion launch --name=hello --resources=cpu=2 -- python train.py",
        (
            "name",
            "project_id",
            "user_id",
            "resources",
            "priority",
            "env",
            "cleanup_command",
            "stop_signal",
            "grace_seconds",
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
            "check",
            "time",
            "after",
            "after_any",
            "array",
            "sweep",
            "group",
            "retry_failed",
            "follow",
            "follow_poll_seconds",
            "daemon_wait_seconds",
        ),
    ),
    Verb(
        "bundle",
        cmd_bundle,
        "bastion bundle [flags]",
        "Build and upload the bundle of the current directory only; print its record.",
        "bastion bundle --bundler_exclude=data",
        ("bundler", "bundler_type", "bundler_spec", "bundler_exclude", "source_dir"),
    ),
    Verb(
        "update",
        cmd_update,
        "bastion update NAME -- NEW COMMAND...",
        (
            "Give an active job a new command; a running attempt restarts with it. The job keeps "
            "its owner's identity; another user's job needs --force."
        ),
        "bastion update train -- python train.py --resume",
        ("user_id", "force"),
    ),
    Verb(
        "cancel",
        cmd_cancel,
        "bastion cancel NAME... | --group=G | --state=S [--yes]",
        (
            "Stop jobs: each one's stop signal (SIGTERM unless it chose --stop_signal), "
            "SIGKILL after its --grace_seconds (else the daemon's). Several names or a filter "
            "(your jobs only) ask first unless --yes. Another user's job needs --force."
        ),
        "bastion cancel hello",
        ("user_id", "force", "group", "state", "project_id", "yes"),
    ),
)
