#!/usr/bin/env bash
# Installs everything the tests need into .venv, then runs the linter and the test suite.
# Usage: ./scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check .
# A real headless Chromium for the status page's tests (tests/test_status_page.py): Debian's
# package, installed once system-wide when missing; nothing is kept in the repository.
if ! command -v chromium >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q
    apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends chromium
fi
# A real kube-apiserver for the gke tests: built once from Debian's source (minutes), then
# cached; run here so its build log shows, and the tests' session fixture finds it ready.
bash scripts/kube_setup.sh >/dev/null
.venv/bin/pytest -q "$@"
