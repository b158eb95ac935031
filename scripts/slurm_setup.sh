#!/usr/bin/env bash
# Slurm's and munge's programs for the tests' single-node cluster (tests/slurm_cluster.py).
#
# Usage: scripts/slurm_setup.sh
#
# Idempotent: a machine that has them already takes a few milliseconds. Installs Debian's
# slurm-wlm (slurmctld, slurmd and the client commands) and munge when sbatch, slurmctld,
# slurmd or munged is missing, and makes a munge key when /etc/munge/munge.key is absent. It
# starts nothing: the tests write their own config under a temporary directory, start
# munged, slurmctld and slurmd there on free ports, and stop them by pid (no systemd needed).
set -euo pipefail

log() { printf '[slurm_setup %s] %s\n' "$(date +%T)" "$*" >&2; }

# One setup at a time (parallel test sessions share the machine's packages).
exec 9>"${TMPDIR:-/tmp}/bastion-slurm-setup.lock"
flock -w 900 9

missing=()
for program in sbatch squeue scancel slurmctld slurmd; do
    command -v "$program" >/dev/null || { missing+=(slurm-wlm); break; }
done
command -v munged >/dev/null || [[ -x /usr/sbin/munged ]] || missing+=(munge)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q
    apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
fi

KEY=/etc/munge/munge.key
if [[ ! -s $KEY ]]; then
    log "making the munge key $KEY"
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then
        mungekey --create --keyfile="$KEY" --force
    else
        dd if=/dev/urandom of="$KEY" bs=1024 count=1 status=none
    fi
    chmod 600 "$KEY"
fi
log "slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm 2>/dev/null || echo '(not from Debian)') and munge are installed"
