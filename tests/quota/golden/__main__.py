"""`python -m tests.quota.golden --write`: rewrite the golden decision files from the pass as
it is now (review the diff: every change in it is a change of decisions)."""

from __future__ import annotations

import argparse
import sys

from tests.quota.golden.scenarios import GOLDEN_DIR, groups, write_golden


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.quota.golden", description=__doc__)
    parser.add_argument(
        "--write", action="store_true", help=f"rewrite the JSON files under {GOLDEN_DIR}"
    )
    args = parser.parse_args(argv)
    if not args.write:
        parser.error("nothing to do: pass --write to regenerate the golden files")
    for group, scenarios in groups().items():
        path = write_golden(group)
        print(f"wrote {path} ({len(scenarios)} scenarios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
