"""``bastion outputs NAME``: a job's outputs and checkpoints (list, --download, --delete)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from absl import flags

from launch.api import Client
from launch.cli.common import FLAGS, UsageError, Verb, client_of, one_name
from launch.outputs import OutputsError, download

flags.DEFINE_string(
    "download", None, "outputs: fetch the files into this directory (only what changed)."
)
flags.DEFINE_bool("delete", False, "outputs: remove the job's outputs from the bucket.")


def cmd_outputs(args: Sequence[str]) -> int:
    name = one_name(args, "outputs")
    if FLAGS.delete and FLAGS.download:
        raise UsageError("outputs: give --download or --delete, not both")
    client = client_of(name=name)
    files = client.outputs(name)
    if FLAGS.delete:
        return _delete(client, name, len(files), sum(f.size for f in files.values()))
    if FLAGS.download is not None:
        try:
            done = download(client.store, name, FLAGS.download)
        except OutputsError as e:
            raise UsageError(str(e)) from None
        print(
            f"{len(done.fetched)} file(s) fetched ({_size(done.fetched_bytes)}), "
            f"{len(done.unchanged)} unchanged, into {FLAGS.download}"
        )
        return 0
    if not files:
        print(f"{name} has no outputs (yet) in {client.store.outputs.url(name)}")
        return 0
    for rel, f in files.items():
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(f.mtime)) if f.mtime else "-"
        print(f"{_size(f.size):>10}  {stamp}Z  {rel}")
    total = sum(f.size for f in files.values())
    print(f"{len(files)} file(s), {_size(total)} in {client.store.outputs.url(name)}")
    return 0


def _delete(client: Client, name: str, count: int, total: int) -> int:
    url = client.store.outputs.url(name)
    if not FLAGS.yes:
        if not sys.stdin.isatty():
            raise UsageError(
                f"outputs --delete removes {count} file(s) ({_size(total)}) in {url}; "
                "confirm with --yes (no terminal to ask on)"
            )
        answer = input(f"remove {count} file(s) ({_size(total)}) in {url}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    client.outputs(name, delete=True)
    print(f"removed {count} file(s) ({_size(total)}) from {url}")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


VERBS = (
    Verb(
        "outputs",
        cmd_outputs,
        "bastion outputs NAME [--download=DIR | --delete [--yes]]",
        (
            "A job's outputs and checkpoints ($BASTION_OUTPUT_DIR, kept in ROOT/outputs/NAME/ "
            "across attempts and after the job ends): list them with sizes and times, fetch "
            "them (only what changed), or remove them."
        ),
        "bastion outputs train --download=./train-out",
        ("download", "delete", "yes"),
    ),
)
