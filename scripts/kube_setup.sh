#!/usr/bin/env bash
# A real kube-apiserver (and kube-controller-manager for the garbage collector) plus etcd for the
# gke runner's tests, built once from Debian's own `kubernetes` source package and cached.
#
# Usage: eval "$(scripts/kube_setup.sh [STATE_DIR])"
#
# Prints only `export` lines on stdout: BASTION_KUBE_APISERVER, BASTION_KUBE_CONTROLLER_MANAGER
# and BASTION_ETCD, the three binaries tests/kube_cluster.py starts. Everything else goes to
# stderr. Idempotent: with the binaries cached in STATE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/bastion-kube) a second run costs about a second.
#
# Why a build: nothing reachable from here ships a kube-apiserver binary (no PyPI wheel, no npm
# package, no Debian binary package), but Debian bookworm ships the full Kubernetes 1.20.2 tree
# with vendor/ as the source package `kubernetes` (it only builds kubectl from it). With Debian's
# Go 1.19 it builds as is except for one vendored package: modern-go/reflect2 v1.0.1 makes the
# apiserver segfault on the first custom-object write under Go >= 1.18, so it is replaced by
# Debian's golang-github-modern-go-reflect2-dev 1.0.2 before the build
# (../shared/reference/engines.md section 3.3). A failed build exits non-zero: the gke tests
# then fail loudly rather than being skipped.
set -euo pipefail

STATE=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/bastion-kube}
VERSION=1.20.2
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
APISERVER="$STATE/kube-apiserver-$VERSION"
CONTROLLER_MANAGER="$STATE/kube-controller-manager-$VERSION"

exec 3>&1 1>&2 # fd 3: the caller's stdout, for the exports only
log() { printf '[kube_setup %s] %s\n' "$(date +%T)" "$*"; }

emit() {
    printf 'export BASTION_KUBE_APISERVER=%s\n' "$APISERVER" >&3
    printf 'export BASTION_KUBE_CONTROLLER_MANAGER=%s\n' "$CONTROLLER_MANAGER" >&3
    printf 'export BASTION_ETCD=%s\n' "$(command -v etcd)" >&3
}

# One setup at a time per state dir (parallel test sessions).
exec 9>"$STATE/setup.lock"
flock -w 1800 9

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "$@"
}

if [[ -x $APISERVER && -x $CONTROLLER_MANAGER ]] && command -v etcd >/dev/null; then
    log "cached: $APISERVER, $CONTROLLER_MANAGER"
    emit
    exit 0
fi

# -- packages ----------------------------------------------------------------------------------
REFLECT2=/usr/share/gocode/src/github.com/modern-go/reflect2
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
if [[ ! -x $APISERVER || ! -x $CONTROLLER_MANAGER ]]; then
    command -v go >/dev/null || missing+=(golang-go)
    [[ -d $REFLECT2 ]] || missing+=(golang-github-modern-go-reflect2-dev)
    command -v make >/dev/null || missing+=(make)
    command -v rsync >/dev/null || missing+=(rsync)
fi

# `apt-get source` needs a deb-src entry for the mirror the machine already uses; Debian's
# images ship `Types: deb` only.
SRC_LIST=/etc/apt/sources.list.d/bastion-deb-src.sources
need_update=0
if [[ ! -x $APISERVER || ! -x $CONTROLLER_MANAGER ]] && ! apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes'; then
    MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
    log "adding a deb-src entry for $MIRROR bookworm in $SRC_LIST"
    cat >"$SRC_LIST" <<EOF
Types: deb-src
URIs: $MIRROR
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    need_update=1
fi
if ((need_update)) || ((${#missing[@]})); then
    log "apt-get update"
    apt-get -o DPkg::Lock::Timeout=600 update -q
fi
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt_install "${missing[@]}"
fi

# -- source ------------------------------------------------------------------------------------
SRC="$STATE/src"
if [[ ! -f $SRC/.unpacked ]]; then
    rm -rf "$SRC" "$STATE/download"
    mkdir -p "$STATE/download" "$SRC"
    log "downloading Debian's kubernetes source package (34 MB)"
    (cd "$STATE/download" && apt-get source --download-only -q kubernetes)
    ORIG=$(ls "$STATE"/download/kubernetes_*.orig.tar.* | head -1)
    log "unpacking $ORIG"
    tar -xf "$ORIG" -C "$SRC" --strip-components=1
    [[ -d $SRC/cmd/kube-apiserver ]] || {
        log "no cmd/kube-apiserver in $ORIG"
        exit 1
    }
    touch "$SRC/.unpacked"
fi

# -- the one vendored package that breaks on Go >= 1.18 -------------------------------------------
VENDORED="$SRC/vendor/github.com/modern-go/reflect2"
if [[ ! -f $VENDORED/.debian-1.0.2 ]]; then
    log "replacing vendored modern-go/reflect2 v1.0.1 with Debian's 1.0.2"
    rm -rf "$VENDORED"
    mkdir -p "$VENDORED"
    cp -rL "$REFLECT2"/. "$VENDORED"/
    find "$VENDORED" -name '*_test.go' -delete
    touch "$VENDORED/.debian-1.0.2"
fi

# -- build -------------------------------------------------------------------------------------
# debian/rules' recipe: a GOPATH with k8s.io/kubernetes pointing at the tree, no module proxy.
GOPATH_DIR="$STATE/gopath"
mkdir -p "$GOPATH_DIR/src/k8s.io"
ln -sfn "$SRC" "$GOPATH_DIR/src/k8s.io/kubernetes"
start=$(date +%s)
log "building kube-apiserver and kube-controller-manager $VERSION (about 4-10 minutes)"
(
    cd "$GOPATH_DIR/src/k8s.io/kubernetes"
    export GOPATH="$GOPATH_DIR" GOPROXY=off GOFLAGS=-mod=vendor CGO_ENABLED=0
    export GOCACHE="$STATE/gocache" KUBE_BUILD_PLATFORMS=linux/amd64
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager"
) >"$STATE/build.log" 2>&1 || {
    log "the build failed; the end of $STATE/build.log:"
    tail -n 40 "$STATE/build.log" >&2
    exit 1
}
OUT="$SRC/_output/local/bin/linux/amd64"
[[ -x $OUT/kube-apiserver ]] || OUT="$SRC/_output/bin"
cp "$OUT/kube-apiserver" "$APISERVER.tmp" && mv "$APISERVER.tmp" "$APISERVER"
cp "$OUT/kube-controller-manager" "$CONTROLLER_MANAGER.tmp"
mv "$CONTROLLER_MANAGER.tmp" "$CONTROLLER_MANAGER"
log "built in $(($(date +%s) - start)) s: $APISERVER, $CONTROLLER_MANAGER"
emit
