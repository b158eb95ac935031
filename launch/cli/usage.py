"""``bastion usage``: who used what, from the usage ledger (ROOT/usage/) alone."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

from absl import flags

from launch.cli.common import FLAGS, UsageError, Verb, client_of, no_args

flags.DEFINE_string("by", "project", "usage: sum per project, user (per project) or resource.")
flags.DEFINE_string("since", "7d", "usage: window start: 7d, 12h, 2026-11-20, 2026-11-20T10:00.")
flags.DEFINE_string("until", None, "usage: window end (same forms as --since; default now).")
flags.DEFINE_bool("csv", False, "usage: print CSV (hours per resource) instead of a table.")
flags.DEFINE_string(
    "prices",
    None,
    "usage: TOML file or URL with [prices] per resource-hour, adding a cost (default: "
    "ROOT/usage/prices.toml when it exists).",
)


def cmd_usage(args: Sequence[str]) -> int:
    from launch.usage import (
        UsageInputError,
        header,
        load_prices,
        report,
        to_csv,
        to_json,
        to_table,
        window,
    )

    no_args(args, "usage")
    if FLAGS.csv and FLAGS.json:
        raise UsageError("usage: give --csv or --json, not both")
    now = time.time()
    try:
        since, until = window(FLAGS.since, FLAGS.until, now)
        client = client_of()
        default = client.store.reports.prices_url()
        url = FLAGS.prices or (default if client.store.quota.token(default) else None)
        prices, currency = load_prices(client.store, url) if url else ({}, "")
        rows = report(client.store, FLAGS.by, since, until, now)
    except UsageInputError as e:
        raise UsageError(str(e)) from None
    if FLAGS.json:
        data = to_json(rows, FLAGS.by, since, until, prices)
        if prices:
            data["currency"] = currency
        print(json.dumps(data, indent=1))
    elif FLAGS.csv:
        sys.stdout.write(to_csv(rows, FLAGS.by, prices))
    else:
        print(header(since, until))
        print(to_table(rows, FLAGS.by, prices, currency))
    return 0


VERBS = (
    Verb(
        "usage",
        cmd_usage,
        "bastion usage [--by=project|user|resource] [--since=7d] [--until=T] [--csv|--json] "
        "[--prices=FILE]",
        (
            "Resource-hours used, of which borrowed (admitted beyond quota), and hours lost to "
            "preemption, per project, user or resource, from the usage ledger (ROOT/usage/)."
        ),
        "bastion usage --by=user --since=7d",
        ("by", "since", "until", "csv", "json", "prices"),
    ),
)
