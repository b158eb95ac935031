#!/usr/bin/env bash
# Installs Bastion into .venv, starts a daemon on the demo's root unless one already holds it
# (its lease says so), submits a sample job, tails its log to the end and lists jobs.
# The root is $BASTION_ROOT, else ~/.local/share/bastion (a local directory as the bucket).
# Usage: ./scripts/demo.sh
# It leaves the daemon it started running and records its pid: stop it with
#   kill "$(cat "${XDG_STATE_HOME:-$HOME/.local/state}/bastion/demo-daemon.pid")"
# (BASTION_DEMO_SKIP_INSTALL=1 skips the pip install, for a .venv that is already set up.)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BASTION_DEMO_SKIP_INSTALL:-}" ]; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -e .
fi
export PATH="$PWD/.venv/bin:$PATH"
state="${XDG_STATE_HOME:-$HOME/.local/state}/bastion"
mkdir -p "$state"
daemon_log="$state/demo-daemon.out"
pid_file="$state/demo-daemon.pid"
# `bastion status` reads the lease of this root only: exit 0 while a daemon holds it.
if bastion status; then
  echo "a daemon already holds this root; using it"
else
  nohup bastion start --poll_seconds=1 >"$daemon_log" 2>&1 &
  echo $! >"$pid_file"
  echo "started the daemon (pid $!, recorded in $pid_file; output in $daemon_log)"
  for _ in $(seq 1 60); do
    bastion status >/dev/null && break
    if ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
      echo "the daemon exited; its output:" >&2
      cat "$daemon_log" >&2
      exit 1
    fi
    sleep 0.5
  done
fi
name="hello-$(date +%s)"
demo_dir="$(mktemp -d)"
trap 'rm -rf "$demo_dir"' EXIT
cd "$demo_dir"  # the job's code: an empty project, bundled and run in its own directory
bastion launch --name="$name" --project_id=default --resources=cpu=1 -- \
  bash -c 'for i in 1 2 3; do echo "line $i from $BASTION_JOB_NAME (attempt $BASTION_ATTEMPT)"; sleep 1; done'
bastion logs "$name" --follow --follow_poll_seconds=0.5 --exit_status
bastion list --all
bastion history "$name"
echo "the daemon keeps running; stop it with: kill \"\$(cat $pid_file)\""
