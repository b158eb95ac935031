"""Verbs that write: launch, bundle, update, cancel (and the flags only they take)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Sequence

from absl import flags

from bastion.bucket.store import resolve_root
from bastion.jobspec import SpecError, check_grace_seconds, check_stop_signal, parse_resources
from launch.api import (
    default_job_name,
    default_user,
    new_jobspec,
)
from launch.bundling import instance_type_runner, make_bundle
from launch.cli.common import (
    FLAGS,
    UsageError,
    Verb,
    client_of,
    command_of,
    follow,
    no_args,
    one_name,
)
from launch.status import check_root

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
flags.DEFINE_string(
    "stop_signal",
    None,
    "launch: the signal that warns the job before a stop (TERM, INT, HUP, QUIT, USR1, USR2; "
    "default TERM); SIGKILL follows after --grace_seconds.",
)
flags.DEFINE_string("cleanup_command", None, "Command run after the job ends, with its own log.")
flags.DEFINE_string(
    "runner", None, "launch: where the job runs: local, docker, ... (default: the daemon's)."
)
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


DEFAULT_RESOURCES = {"cpu": 1}


INSTANCE_TYPE_RUNNERS = frozenset({"gke"})


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
        command=command_of(args, "launch"),
        user_id=user,
        project_id=FLAGS.project_id,
        resources=resources,
        priority=FLAGS.priority,
        cleanup_command=FLAGS.cleanup_command,
        env_vars=env or None,
        runner=runner,
        bundle=_bundle(dry_run=FLAGS.dry_run),
        stop_signal=check_stop_signal(FLAGS.stop_signal, "--stop_signal"),
        grace_seconds=check_grace_seconds(FLAGS.grace_seconds, "--grace_seconds"),
    )
    if FLAGS.dry_run:
        print(json.dumps(spec.to_json(), indent=1))
        return 0
    root = resolve_root(FLAGS.root)
    local = "://" not in root or root.startswith("file://")
    new_root = local and not os.path.isdir(root.removeprefix("file://"))
    client = client_of(reading=False)
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
        return follow(client, spec.name, exit_status=True)
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
    name = one_name(args, "cancel")
    client_of(name=name).cancel(name, FLAGS.user_id, force=FLAGS.force)
    print(f"cancel requested for {name}; the daemon stops it on its next cycle")
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
        "bastion launch [flags] -- COMMAND...",
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
        "bastion cancel NAME",
        (
            "Stop a job: its stop signal (SIGTERM unless it chose --stop_signal), SIGKILL after "
            "its --grace_seconds (else the daemon's). Another user's job needs --force."
        ),
        "bastion cancel hello",
        ("user_id", "force"),
    ),
)
