"""``bastion launch --check``: the job checked against the root without submitting it.

Separate from submit.py so that the verb's module stays small: this reads what the daemon
published (capabilities, queue summary, its liveness) and prints what submitting would meet.
"""

from __future__ import annotations

from bastion.bucket.store import resolve_root
from bastion.jobspec import JobSpec
from launch.checks import Flags, outlook, refuse_mistakes
from launch.cli.common import FLAGS, client_of


def launch_check(spec: JobSpec, instance_type: str | None) -> int:
    """Exit 0 when the job fits what the daemon serves (printing what it would wait for); a
    SpecMistake (exit 2) otherwise. Nothing is written to the root."""
    root = resolve_root(FLAGS.root)
    client = client_of(reading=True)
    checked = refuse_mistakes(client.store, spec, Flags(instance_type))
    units = ", ".join(f"{r}={n}" for r, n in sorted(spec.metadata.resources.items()))
    runner = f"runner {spec.runner_kind}" if spec.runner_kind else "the daemon's default runner"
    print(f"check of {spec.name} against {root}: nothing submitted")
    if checked:
        print(
            f"  ok: {runner}, project {spec.metadata.project_id} (user "
            f"{spec.metadata.user_id}), resources {units}"
        )
    else:
        print(
            "  not checked against a daemon: none has published what it serves on this root "
            "(start one: bastion start)"
        )
    if spec.bundle:
        size = spec.bundle.get("size")
        shown = f"{size / 1e6:.1f} MB" if isinstance(size, int) else "size unknown"
        print(f"  code: {spec.bundle['kind']} bundle, {shown}")
    print(f"  {outlook(spec, client.queue() if checked else None)}")
    status = client.daemon_status()
    if status.stopped:
        print(f"  but no daemon acts on the root now: {status.message}")
    return 0
