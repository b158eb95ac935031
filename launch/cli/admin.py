"""Verbs that run or check things: start, quota, simulate, vm (and their own flags)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from absl import flags

from bastion.bucket.store import resolve_root
from launch.api import (
    Client,
    UnknownJob,
)
from launch.cli.common import DEFAULT_GRACE, FLAGS, UsageError, Verb, no_args
from launch.status import check_root

flags.DEFINE_float("poll_seconds", 3.0, "Seconds between cycles (simulate: between policy passes).")
flags.DEFINE_bool("once", False, "Run one cycle and exit (tests, cron).")
flags.DEFINE_string(
    "work_dir",
    None,
    "Local directory for log mirrors and attempt "
    "files (default: ~/.local/state/bastion/<hash of root>).",
)
flags.DEFINE_float(
    "lease_seconds",
    60.0,
    "A second daemon on the same root takes over only after the holder's lease stayed "
    "unrenewed this long (0: no lease, for a root only one daemon will ever use).",
)
flags.DEFINE_string(
    "settings",
    None,
    "Daemon settings TOML (default_runner, [runners.KIND] options; README: Settings).",
)
flags.DEFINE_string("vm_name", None, "Name of the VM that runs the daemon.")
flags.DEFINE_string("zone", None, "Compute Engine zone, e.g. us-central1-a.")
flags.DEFINE_string("machine_type", "e2-standard-2", "Machine type of the VM (create).")
flags.DEFINE_string("project", None, "GCP project (default: that of the credentials).")
flags.DEFINE_string("service_account", None, "The VM's service account email (create).")
flags.DEFINE_string("trace", None, "JSON-lines trace file.")
flags.DEFINE_string("events", None, "Also write every decision as JSON lines here.")


def cmd_start(args: Sequence[str]) -> int:
    from bastion.bucket.store import Store
    from bastion.daemon.start import start_daemon

    no_args(args, "start")
    root = resolve_root(FLAGS.root)
    check_root(root, reading=False)
    if FLAGS.quota_file and Store(root).quota.token(FLAGS.quota_file) is None:
        raise UnknownJob(
            f"no quota file at {FLAGS.quota_file}; fix --quota_file, or leave it out (the daemon "
            f"then reads {Store(root).quota.default_url()}, and without it runs one project "
            "'default' on this machine's pool)"
        )
    return start_daemon(
        root=root,
        work_dir=FLAGS.work_dir,
        quota_file=FLAGS.quota_file,
        poll_seconds=FLAGS.poll_seconds,
        once=FLAGS.once,
        grace_seconds=DEFAULT_GRACE if FLAGS.grace_seconds is None else FLAGS.grace_seconds,
        lease_seconds=FLAGS.lease_seconds,
        settings_file=FLAGS.settings,
    )


QUOTA_USAGE = "bastion quota check [FILE|ROOT] | bastion quota upload FILE"
_PLACEHOLDERS = ("FILE", "ROOT", "FILE|ROOT")


def cmd_quota(args: Sequence[str]) -> int:
    from quota import commands

    if not args or args[0] not in ("check", "upload") or len(args) > 2:
        raise UsageError(f"quota: {QUOTA_USAGE}")
    if args[1:2] and args[1] in _PLACEHOLDERS:
        raise UsageError(
            f"quota {args[0]}: {args[1]!r} is a placeholder; give a quota file's path or URL, or "
            "a root (e.g. bastion quota check gs://my-bucket/bastion), or leave it out for --root"
        )
    if args[0] == "upload":
        if len(args) != 2:
            raise UsageError("quota upload: give the quota file, e.g. bastion quota upload q.toml")
        from launch.quota_upload import upload

        return upload(args[1], resolve_root(FLAGS.root), sys.stdout)
    target = args[1] if len(args) == 2 else resolve_root(FLAGS.root)
    if _is_root(target):
        return _check_root_quota(target)
    return commands.check(target, sys.stdout)


def cmd_simulate(args: Sequence[str]) -> int:
    from quota import commands

    no_args(args, "simulate")
    if not FLAGS.quota_file or not FLAGS.trace:
        raise UsageError("simulate: bastion simulate --quota_file=FILE --trace=FILE")
    return commands.simulate(
        FLAGS.quota_file, FLAGS.trace, FLAGS.poll_seconds, FLAGS.json, FLAGS.events, sys.stdout
    )


def cmd_vm(args: Sequence[str]) -> int:
    from bastion import vm

    if len(args) != 1 or args[0] not in ("create", "delete", "status"):
        raise UsageError("vm: bastion vm create|delete|status --vm_name=NAME --zone=ZONE")
    if args[0] == "create":
        try:
            vm.refuse_local_root(resolve_root(FLAGS.root))
        except vm.VmError as e:
            raise UsageError(str(e)) from None
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
    if client.store.quota.token(url) is None:
        print(f"no quota file at {url}: the daemon runs one project 'default' on its pool")
        return 0
    code = commands.check(url, sys.stdout)
    refusal = quota_refusal(client, url)
    if refusal:
        print(refusal.splitlines()[0])
        last_good = client.store.quota.read_last_good()
        if last_good:
            from quota.config import parse_quota

            print(commands.quota_table(parse_quota(last_good, source="last good quota")))
    return code


VERBS = (
    Verb(
        "start",
        cmd_start,
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
    Verb(
        "quota",
        cmd_quota,
        QUOTA_USAGE,
        (
            "Check a quota file (every problem with its key, or the quota per project); for a "
            "root (default: --root), the file its daemon reads and whether it runs on the last "
            "good version. upload: check FILE, then write it atomically where the root's daemon "
            "reads it."
        ),
        "bastion quota check configs/project-quotas.toml",
        (),
    ),
    Verb(
        "simulate",
        cmd_simulate,
        "bastion simulate --quota_file=FILE --trace=FILE [--json]",
        "Replay a JSON-lines trace with the daemon's scheduling policy; print the metrics.",
        "bastion simulate --quota_file=configs/project-quotas.toml --trace=trace.jsonl",
        ("quota_file", "trace", "json", "events", "poll_seconds"),
    ),
    Verb(
        "vm",
        cmd_vm,
        "bastion vm create|delete|status --vm_name=NAME --zone=ZONE",
        "A Compute Engine VM that runs the daemon on the root.",
        "bastion vm create --vm_name=bastion-1 --zone=us-central1-a",
        ("vm_name", "zone", "machine_type", "project", "service_account", "image"),
    ),
)
