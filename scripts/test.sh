#!/usr/bin/env bash
# Installs everything the tests need into .venv, then runs the linter and the test suite.
# Usage: ./scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check .
.venv/bin/pytest -q "$@"
