#!/usr/bin/env bash
# Builds the worker image (docker/Dockerfile) with or without access to an image registry.
#
# Usage: docker/build-image.sh [--tag TAG] [--base auto|registry|debian|IMAGE] [--force]
#
#   --tag    image to build (default: lightning-hetero-worker:latest, the emulator's cluster.image)
#   --base   auto (default): python:3.11-slim when it is present or can be pulled, else a Debian base;
#            registry: python:3.11-slim only; debian: a Debian bookworm base built here with debootstrap and
#            `docker import` (needs root or sudo, and the debootstrap package); IMAGE: any image with Python 3.11
#   --force  rebuild even when an image built from the same inputs exists
#
# Environment: TORCH_INDEX_URL (an index holding CPU torch, used when no local torch wheel is configured; default
# https://download.pytorch.org/whl/cpu), DEBIAN_MIRROR (default: the host's apt source for bookworm, else
# http://deb.debian.org/debian), PULL_TIMEOUT_S (how long to try the registry in auto mode; default 60).
#
# The host's pip settings (index URLs, find-links, CA bundle; from `pip config list`, which includes PIP_*
# variables) are passed into the build's first stage only: http(s) indexes as they are, the newest local CPU torch
# wheel for Python 3.11 found in a find-links folder copied in. The image keeps none of them. The build context is
# a small staged folder (the legacy builder, Debian's default, ignores docker/Dockerfile.dockerignore).
# An image whose label io.lightning-hetero.inputs matches the hash of the staged inputs is reused, not rebuilt.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TAG=${LIGHTNING_HETERO_IMAGE:-lightning-hetero-worker:latest}
BASE=auto
FORCE=0
REGISTRY_IMAGE=python:3.11-slim
SUITE=bookworm # Python 3.11, the version of the local torch wheels looked for
PYTHON_TAG=cp311
DEBIAN_PACKAGES=python3,python3-venv,python3-pip,ca-certificates
BASE_REPOSITORY=lightning-hetero-base
# Raise when the Debian base recipe below changes, so cached bases are rebuilt.
BASE_RECIPE=1

say() { printf 'build-image: %s\n' "$*" >&2; }
die() {
    say "error: $*"
    exit 1
}

while [ $# -gt 0 ]; do
    case $1 in
    --tag) TAG=${2:?--tag needs a value}; shift 2 ;;
    --base) BASE=${2:?--base needs a value}; shift 2 ;;
    --force) FORCE=1; shift ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done

# One build at a time on a host: a second caller waits, then finds the image up to date.
exec 9>"${TMPDIR:-/tmp}/lightning-hetero-build-image.lock"
flock 9

docker info >/dev/null 2>&1 || die "cannot reach the Docker daemon; start it (sudo systemctl start docker, or sudo dockerd &) or set DOCKER_HOST"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
label_of() { docker image inspect -f "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/lightning-hetero-build.XXXXXX")
ROOTFS=
cleanup() {
    [ -z "$ROOTFS" ] || as_root rm -rf "$ROOTFS"
    rm -rf "$WORK"
}
trap cleanup EXIT

debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local mirror
    # deb822 stanzas (Debian 12's default), then one-line sources; only a source that carries the suite itself
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$SUITE" 'BEGIN { RS = "" }
        { uris = ""; ok = 0; n = split($0, lines, "\n")
          for (i = 1; i <= n; i++) {
              split(lines[i], f, /[ \t]+/)
              if (f[1] == "URIs:") uris = f[2]
              if (f[1] == "Suites:") for (j = 2; j in f; j++) if (f[j] == suite) ok = 1
          }
          if (ok && uris != "") { print uris; exit } }')
    if [ -z "$mirror" ]; then
        mirror=$(cat /etc/apt/sources.list 2>/dev/null | awk -v suite="$SUITE" '$1 == "deb" {
            sub(/\[[^]]*\] */, ""); if ($3 == suite) { print $2; exit } }')
    fi
    echo "${mirror:-http://deb.debian.org/debian}"
}

debian_base() {
    local mirror hash tag started
    mirror=$(debian_mirror)
    hash=$(printf '%s\n' "$BASE_RECIPE" "$SUITE" "$mirror" "$DEBIAN_PACKAGES" | sha256sum | cut -c1-16)
    tag="$BASE_REPOSITORY:$SUITE-$hash"
    if docker image inspect "$tag" >/dev/null 2>&1; then
        say "reusing the Debian base $tag"
        BASE_IMAGE=$tag
        return
    fi
    command -v debootstrap >/dev/null 2>&1 || as_root sh -c 'command -v debootstrap' >/dev/null 2>&1 ||
        die "debootstrap is not installed: sudo apt-get install debootstrap (or pass --base IMAGE, an image with Python 3.11)"
    started=$(date +%s)
    ROOTFS=$(mktemp -d "${TMPDIR:-/tmp}/lightning-hetero-rootfs.XXXXXX")
    say "building the Debian base $tag: debootstrap $SUITE from $mirror (a few minutes)"
    if ! as_root debootstrap --variant=minbase --include="$DEBIAN_PACKAGES" "$SUITE" "$ROOTFS" "$mirror" \
        >"$WORK/debootstrap.log" 2>&1; then
        tail -n 15 "$WORK/debootstrap.log" >&2
        die "debootstrap of $SUITE from $mirror failed (above); set DEBIAN_MIRROR to a reachable Debian mirror, or pass --base IMAGE"
    fi
    as_root sh -c "rm -rf '$ROOTFS'/var/cache/apt/archives/*.deb '$ROOTFS'/var/lib/apt/lists/*"
    as_root tar -C "$ROOTFS" -c . | docker import \
        -c 'CMD ["/bin/bash"]' -c "LABEL io.lightning-hetero.base-inputs=$hash" \
        -m "debootstrap --variant=minbase --include=$DEBIAN_PACKAGES $SUITE $mirror" - "$tag" >/dev/null
    as_root rm -rf "$ROOTFS"
    ROOTFS=
    say "built the Debian base $tag in $(($(date +%s) - started)) s"
    BASE_IMAGE=$tag
}

registry_base() {
    docker image inspect "$REGISTRY_IMAGE" >/dev/null 2>&1 && return 0
    say "pulling $REGISTRY_IMAGE (up to ${PULL_TIMEOUT_S:-60} s)"
    timeout "${PULL_TIMEOUT_S:-60}" docker pull -q "$REGISTRY_IMAGE" >/dev/null 2>&1
}

pick_base() {
    case $BASE in
    registry)
        registry_base || die "cannot pull $REGISTRY_IMAGE; without a registry use --base debian"
        BASE_IMAGE=$REGISTRY_IMAGE
        ;;
    debian) debian_base ;;
    auto)
        # a Debian base made earlier is used before the registry is asked, so reruns never wait on the network
        if docker image inspect "$REGISTRY_IMAGE" >/dev/null 2>&1; then
            BASE_IMAGE=$REGISTRY_IMAGE
        elif [ -n "$(docker images -q --filter "label=io.lightning-hetero.base-inputs" "$BASE_REPOSITORY")" ]; then
            debian_base
        elif registry_base; then
            BASE_IMAGE=$REGISTRY_IMAGE
        else
            say "no image registry reachable; building a Debian base instead"
            debian_base
        fi
        ;;
    *)
        docker image inspect "$BASE" >/dev/null 2>&1 || docker pull -q "$BASE" >/dev/null 2>&1 ||
            die "base image $BASE is neither present nor pullable"
        BASE_IMAGE=$BASE
        ;;
    esac
}

# The host's pip settings, last one listed winning (pip lists global, user, site, then PIP_* variables); where
# python3 has no pip, the PIP_* variables alone.
pip_setting() {
    local value variable
    value=$(python3 -m pip config list 2>/dev/null | sed -n "s/^[^ ]*\.$1='\(.*\)'\$/\1/p" | tail -n 1 || true)
    variable=PIP_$(echo "$1" | tr 'a-z-' 'A-Z_')
    echo "${value:-${!variable:-}}"
}

stage_context() {
    local ctx=$WORK/context index extra links cert url dir wheel fallback
    mkdir -p "$ctx/pip/wheels"
    cp "$ROOT/docker/Dockerfile" "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/LICENSE" "$ctx/"
    tar -C "$ROOT" --exclude=__pycache__ --exclude='*.egg-info' --exclude='*.pyc' -c src examples | tar -C "$ctx" -x

    index=$(pip_setting index-url)
    extra=$(pip_setting extra-index-url)
    links=$(pip_setting find-links)
    cert=$(pip_setting cert)
    : >"$ctx/pip/env"
    fallback=https://pypi.org/simple
    case $index in
    http://* | https://*) printf 'export PIP_INDEX_URL=%q\n' "$index" >>"$ctx/pip/env"; fallback=$index ;;
    "") ;;
    *) say "not passing the index $index (only http(s) indexes are reachable from the build)" ;;
    esac
    local keep=()
    for url in $extra; do
        case $url in
        http://* | https://*) keep+=("$url") ;;
        *) say "not passing the extra index $url (only http(s) indexes are reachable from the build)" ;;
        esac
    done
    [ ${#keep[@]} = 0 ] || printf 'export PIP_EXTRA_INDEX_URL=%q\n' "${keep[*]}" >>"$ctx/pip/env"
    keep=()
    for url in $links; do
        case $url in
        http://* | https://*) keep+=("$url") ;;
        *)
            dir=${url#file://}
            wheel=$(ls "$dir"/torch-*+cpu-"$PYTHON_TAG"-*.whl 2>/dev/null | sort -V | tail -n 1 || true)
            if [ -n "$wheel" ]; then
                ln "$wheel" "$ctx/pip/wheels/" 2>/dev/null || cp "$wheel" "$ctx/pip/wheels/"
            fi
            ;;
        esac
    done
    [ ${#keep[@]} = 0 ] || printf 'export PIP_FIND_LINKS=%q\n' "${keep[*]}" >>"$ctx/pip/env"
    if [ -n "$cert" ] && [ -f "$cert" ]; then
        cp "$cert" "$ctx/pip/ca.crt"
        echo 'export PIP_CERT=/tmp/pip/ca.crt' >>"$ctx/pip/env"
    fi
    TORCH_WHEEL=$(cd "$ctx/pip/wheels" && ls)
    if [ -z "$TORCH_WHEEL" ] && [ -z "${TORCH_INDEX_URL:-}" ]; then
        TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
    fi
    FALLBACK_INDEX_URL=$fallback
}

started=$(date +%s)
pick_base
stage_context
if [ -n "$TORCH_WHEEL" ]; then
    say "torch from the local wheel $TORCH_WHEEL"
    TORCH_INDEX_URL=
else
    say "torch from $TORCH_INDEX_URL (its dependencies from $FALLBACK_INDEX_URL)"
fi

inputs=$(
    cd "$WORK/context"
    {
        docker image inspect -f '{{.Id}}' "$BASE_IMAGE"
        echo "$TORCH_INDEX_URL $FALLBACK_INDEX_URL"
        find . -type f -print0 | sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-16
)
if [ "$FORCE" = 0 ] && [ "$(label_of "$TAG" io.lightning-hetero.inputs)" = "$inputs" ]; then
    say "$TAG is up to date (inputs $inputs, base $BASE_IMAGE); nothing to build"
    exit 0
fi

python_check='import sys, tomllib, venv; assert sys.version_info[:2] == (3, 11), sys.version'
docker run --rm "$BASE_IMAGE" python3 -c "$python_check" >/dev/null 2>&1 ||
    die "base image $BASE_IMAGE has no python3 3.11 with venv; pass --base IMAGE with one, or --base debian"
previous=$(docker image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)
# BuildKit needs buildx; Debian's docker.io has none, and the staged context needs no .dockerignore anyway
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0
say "building $TAG from $BASE_IMAGE (inputs $inputs)"
docker build -t "$TAG" \
    --label "io.lightning-hetero.inputs=$inputs" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL" \
    --build-arg "FALLBACK_INDEX_URL=$FALLBACK_INDEX_URL" \
    "$WORK/context" >&2 || die "docker build failed (above)"
current=$(docker image inspect -f '{{.Id}}' "$TAG")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    docker image rm "$previous" >/dev/null 2>&1 || true
fi
say "built $TAG in $(($(date +%s) - started)) s"
