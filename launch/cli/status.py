"""``bastion status``: whether a daemon acts on the root; with ``--html``, the status page."""

from __future__ import annotations

import os
import pathlib
import webbrowser
from collections.abc import Sequence

from absl import flags

from launch.cli.common import FLAGS, UsageError, Verb, client_of, no_args

flags.DEFINE_bool("html", False, "status: write the root's status page to --html_path.")
flags.DEFINE_string(
    "html_path", "bastion-status.html", "status --html: where the page is written (a local file)."
)
flags.DEFINE_bool("open", False, "status --html: open the page in a browser once written.")


def cmd_status(args: Sequence[str]) -> int:
    """Whether a daemon acts on the root: exit 0 if one holds its lease, 3 if none does.
    With --html, the page is written first (whatever the daemon's state)."""
    no_args(args, "status")
    if (FLAGS["open"].present or FLAGS["html_path"].present) and not FLAGS.html:
        raise UsageError("status: --open and --html_path go with --html; add --html")
    client = client_of(reading=FLAGS.html)
    if FLAGS.html:
        from launch.page import build_page

        path = pathlib.Path(FLAGS.html_path).expanduser()
        if path.is_dir():
            raise UsageError(
                f"status: --html_path={FLAGS.html_path} is a directory; give a file name, "
                f"e.g. --html_path={os.path.join(FLAGS.html_path, 'bastion-status.html')}"
            )
        if not path.parent.is_dir():
            raise UsageError(
                f"status: --html_path={FLAGS.html_path}: no directory {path.parent}; create "
                "it or give a path in an existing one"
            )
        page, _ = build_page(client.store)
        path.write_text(page, encoding="utf-8")
        print(f"status page written to {path.resolve()}")
        if FLAGS.open:
            webbrowser.open(path.resolve().as_uri())
    status = client.daemon_status()
    print(status.message)
    return 3 if status.stopped else 0


VERBS = (
    Verb(
        "status",
        cmd_status,
        "bastion status [--html [--html_path=FILE] [--open]]",
        (
            "Whether a daemon holds the root's lease (exit 0) or none does (exit 3); with "
            "--html, the root's status page (queue, running jobs, use against quota, usage) "
            "written to a local file."
        ),
        "bastion status --html --open",
        ("html", "html_path", "open"),
    ),
)
