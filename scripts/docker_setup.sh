#!/usr/bin/env bash
# A private Docker engine, a local registry and a Python base image for the tests, offline.
#
# Usage: eval "$(scripts/docker_setup.sh [STATE_DIR])"
#
# Idempotent: every step is skipped when already done, so a second run takes about a second.
# STATE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/bastion-test-docker) holds the engine's
# socket, data and logs, the registry's storage and the cached rootfs tarball; it lives outside
# the repository so that it survives between test runs. The engine and the registry are left
# running on purpose (the next run finds them); stop them with
#   kill $(cat STATE_DIR/dockerd.pid) $(cat STATE_DIR/registry.pid)
#
# Only the final `export` lines go to stdout (everything else to stderr), and the background
# servers hold neither stdout nor stderr, so `$(...)` and subprocess pipes return at once.
#
# No Docker Hub here: the base image is a debootstrapped Debian bookworm with python3, imported
# with `docker import`. dockerd runs without a bridge (containers use host networking), which
# also keeps it off the machine's iptables.
set -euo pipefail

STATE=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/bastion-test-docker}
IMAGE=bastion-test/python:3.11
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
SOCK="$STATE/docker.sock"
export DOCKER_HOST="unix://$SOCK"

exec 3>&1 1>&2 # fd 3: the caller's stdout, for the exports only
log() { printf '[docker_setup %s] %s\n' "$(date +%T)" "$*"; }

# One setup at a time per state dir (parallel test sessions). Background servers close fd 9.
exec 9>"$STATE/setup.lock"
flock -w 900 9

# -- packages ----------------------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v docker-registry >/dev/null || missing+=(docker-registry)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q
    apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
fi

# Start a server in its own session, detached from every pipe and lock this script holds.
detach() {
    local logfile=$1
    shift
    setsid nohup "$@" </dev/null >>"$logfile" 2>&1 3>&- 9>&- &
}

# -- engine ------------------------------------------------------------------------------------
if docker version >/dev/null 2>&1; then
    log "dockerd already answers on $SOCK"
else
    log "starting dockerd on $SOCK"
    # A previous engine killed hard leaves its socket and netns mount behind.
    rm -f "$SOCK"
    if mountpoint -q "$STATE/exec/netns/default" 2>/dev/null; then
        umount "$STATE/exec/netns/default" || true
    fi
    detach "$STATE/dockerd.log" dockerd \
        --data-root "$STATE/data" --exec-root "$STATE/exec" -p "$STATE/dockerd.pid" \
        -H "$DOCKER_HOST" --bridge=none --iptables=false
    for _ in $(seq 600); do
        docker version >/dev/null 2>&1 && break
        sleep 0.1
    done
    if ! docker version >/dev/null 2>&1; then
        log "dockerd did not answer within 60 s; the end of $STATE/dockerd.log:"
        tail -n 40 "$STATE/dockerd.log" >&2 || true
        exit 1
    fi
    log "dockerd is up"
fi

# -- registry ----------------------------------------------------------------------------------
registry_answers() { [[ -n ${1:-} ]] && curl -fs -o /dev/null --max-time 2 "http://$1/v2/"; }

REGISTRY=$(cat "$STATE/registry.addr" 2>/dev/null || true)
if registry_answers "$REGISTRY"; then
    log "registry already answers on $REGISTRY"
else
    # The previous port (so images tagged with the address stay valid), else 5000, else any.
    port=
    for candidate in "${REGISTRY##*:}" 5000; do
        if [[ -n $candidate ]] && ! (exec 8<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
            port=$candidate
            break
        fi
    done
    if [[ -z $port ]]; then
        port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    fi
    REGISTRY=127.0.0.1:$port
    log "starting the registry on $REGISTRY"
    cat >"$STATE/registry.yml" <<EOF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $STATE/registry-data}, delete: {enabled: true}}
http: {addr: $REGISTRY}
EOF
    detach "$STATE/registry.log" docker-registry serve "$STATE/registry.yml"
    echo $! >"$STATE/registry.pid"
    for _ in $(seq 100); do
        registry_answers "$REGISTRY" && break
        sleep 0.1
    done
    if ! registry_answers "$REGISTRY"; then
        log "the registry did not answer within 10 s; the end of $STATE/registry.log:"
        tail -n 40 "$STATE/registry.log" >&2 || true
        exit 1
    fi
    echo "$REGISTRY" >"$STATE/registry.addr"
fi

# -- base image --------------------------------------------------------------------------------
TARBALL="$STATE/rootfs-python-bookworm.tar"
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "image $IMAGE present"
else
    if [[ ! -s $TARBALL ]]; then
        MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
        MIRROR=${MIRROR:-http://deb.debian.org/debian}
        ROOTFS="$STATE/rootfs.tmp"
        rm -rf "$ROOTFS"
        log "debootstrapping python3 into $ROOTFS from $MIRROR (about a minute)"
        debootstrap --variant=minbase --include=python3,ca-certificates bookworm "$ROOTFS" "$MIRROR" \
            >"$STATE/debootstrap.log" 2>&1 || {
            tail -n 40 "$STATE/debootstrap.log" >&2
            exit 1
        }
        rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
            "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
        # The host's TLS goes through a local CA: containers trust what the host trusts.
        if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
            cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
        fi
        tar -C "$ROOTFS" -cf "$TARBALL.tmp" .
        mv "$TARBALL.tmp" "$TARBALL"
        rm -rf "$ROOTFS"
    fi
    log "importing $TARBALL as $IMAGE"
    docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/sh"]' "$TARBALL" "$IMAGE" >/dev/null
fi

# The same image in the registry, so tests can exercise a pull.
if curl -fs -o /dev/null --max-time 5 -I \
    -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
    "http://$REGISTRY/v2/bastion-test/python/manifests/3.11"; then
    log "image $REGISTRY/$IMAGE present in the registry"
else
    log "pushing $IMAGE to $REGISTRY"
    docker tag "$IMAGE" "$REGISTRY/$IMAGE"
    docker push -q "$REGISTRY/$IMAGE" >/dev/null
    docker rmi "$REGISTRY/$IMAGE" >/dev/null
fi

printf 'export DOCKER_HOST=%s\n' "$DOCKER_HOST" >&3
printf 'export BASTION_TEST_REGISTRY=%s\n' "$REGISTRY" >&3
printf 'export BASTION_TEST_IMAGE=%s\n' "$IMAGE" >&3
