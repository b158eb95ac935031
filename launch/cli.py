"""The ``bastion`` command: one verb per user action, flags in absl style (as AXLearn's).

    bastion start [--poll_seconds=S] [--once]
    bastion launch --name=N --project_id=P [--resources=v4=8,cpu=4] [--priority=3] -- CMD...
    bastion list [--all] [--json]        bastion logs NAME [--follow] [--exit_status]
    bastion cancel NAME                  bastion history NAME
    bastion update NAME -- CMD...        bastion why NAME
    bastion quota check FILE             bastion simulate --quota_file=F --trace=T [--json]

Every verb takes --root (else $BASTION_ROOT, else a local directory).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence

from absl import app, flags

from bastion.jobspec import SpecError, parse_resources
from bastion.store import resolve_root
from launch.api import (
    Client,
    JobExists,
    JobInfo,
    UnknownJob,
    age_seconds,
    default_job_name,
    default_user,
    new_jobspec,
)
from launch.bundling import instance_type_runner, make_bundle

FLAGS = flags.FLAGS
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
flags.DEFINE_float("follow_poll_seconds", 1.0, "How often logs --follow polls the bucket.")
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
    "start: daemon settings TOML (default_runner, [runners.KIND] options; see bastion/service.py).",
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


class UsageError(Exception):
    """Bad command line; printed with the verb's usage."""


def _client() -> Client:
    return Client(resolve_root(FLAGS.root))


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
    from bastion.service import start_daemon

    return start_daemon(
        root=resolve_root(FLAGS.root),
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
    resources = parse_resources(FLAGS.resources)
    if FLAGS.instance_type:
        if runner:
            raise UsageError("--instance_type picks the runner: drop --runner/--image")
        runner, implied = instance_type_runner(FLAGS.instance_type, FLAGS.num_replicas, FLAGS.spot)
        resources = {**implied, **resources}
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
    client = _client()
    client.submit(spec)
    print(f"submitted {spec.name} (job_id {spec.metadata.job_id}) to {client.store.root_url}")
    if spec.bundle:
        print(f"  code: {spec.bundle['kind']} bundle {spec.bundle['uri']}")
    print(f"  follow its log:  bastion logs {spec.name} --follow")
    if FLAGS.follow:
        return _follow(client, spec.name)
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
    record = _bundle(dry_run=False)
    print(json.dumps(record, indent=1))
    return 0


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
    jobs = _client().list_jobs(include_completed=FLAGS.all)
    if FLAGS.json:
        print(json.dumps([j.to_json() for j in jobs], indent=1))
        return 0
    rows = [("NAME", "STATE", "PROJECT", "USER", "RESOURCES", "PRI", "AGE", "REASON")]
    rows += [_row(j) for j in jobs]
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
    client = _client()
    if FLAGS.follow:
        return _follow(client, name)
    sys.stdout.write(client.read_log(name).decode(errors="replace"))
    return 0


def _follow(client: Client, name: str) -> int:
    for text in client.follow_log(name, poll_seconds=FLAGS.follow_poll_seconds):
        sys.stdout.write(text)
        sys.stdout.flush()
    info = client.get(name)
    if not FLAGS.exit_status or info.status == "SUCCEEDED":
        return 0
    code = info.state.exit_code if info.state else None
    return code if code and 0 < code < 256 else 1


def cmd_cancel(args: Sequence[str]) -> int:
    name = _one_name(args, "cancel")
    _client().cancel(name, FLAGS.user_id)
    print(f"cancel requested for {name}; the daemon stops it on its next cycle")
    return 0


def cmd_history(args: Sequence[str]) -> int:
    name = _one_name(args, "history")
    client = _client()
    for event in client.history(name):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(event["time"]))
        print(
            f"{stamp}Z  attempt {event.get('attempt', 0)}  {event['event']:<10} "
            f"{event.get('reason', '')}"
        )
    info = client.get(name)
    print(f"now: {info.status}" + (f" ({info.reason})" if info.reason else ""))
    return 0


def cmd_update(args: Sequence[str]) -> int:
    if not args:
        raise UsageError("update: bastion update NAME -- NEW COMMAND")
    name, command = args[0], _command(args[1:], "update")
    spec = _client().update(name, command)
    print(
        f"updated {name} (version {spec.metadata.version}); a running attempt restarts with "
        "the new command"
    )
    return 0


def cmd_why(args: Sequence[str]) -> int:
    from launch.why import explain_job

    name = _one_name(args, "why")
    print(explain_job(_client(), name, FLAGS.quota_file))
    return 0


def cmd_quota(args: Sequence[str]) -> int:
    from quota import commands

    if len(args) != 2 or args[0] != "check":
        raise UsageError("quota: bastion quota check FILE")
    return commands.check(args[1], sys.stdout)


def cmd_simulate(args: Sequence[str]) -> int:
    from quota import commands

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
}


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[1] not in VERBS:
        raise app.UsageError(f"give a verb: {', '.join(VERBS)}")
    try:
        return VERBS[argv[1]](argv[2:])
    except UsageError as e:
        print(f"bastion: {e}", file=sys.stderr)
        return 2
    except (SpecError, UnknownJob, JobExists) as e:
        print(f"bastion: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
