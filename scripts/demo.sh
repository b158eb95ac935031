#!/usr/bin/env bash
# Installs Bastion into .venv, starts the daemon on the embedded default (a local directory as
# the bucket, the local runner), submits a sample job, tails its log to the end and lists jobs.
# Usage: ./scripts/demo.sh            (leaves the daemon running: stop it with `kill <pid>`)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e .
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p "${XDG_STATE_HOME:-$HOME/.local/state}/bastion"
daemon_log="${XDG_STATE_HOME:-$HOME/.local/state}/bastion/demo-daemon.out"
if ! pgrep -f "bastion start" >/dev/null; then
  nohup bastion start --poll_seconds=1 >"$daemon_log" 2>&1 &
  echo "started the daemon (pid $!, output in $daemon_log)"
fi
name="hello-$(date +%s)"
bastion launch --name="$name" --project_id=default --resources=cpu=1 -- \
  bash -c 'for i in 1 2 3; do echo "line $i from $BASTION_JOB_NAME (attempt $BASTION_ATTEMPT)"; sleep 1; done'
bastion logs "$name" --follow --follow_poll_seconds=0.5
bastion list --all
bastion history "$name"
