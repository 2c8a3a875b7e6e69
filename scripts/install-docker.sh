#!/usr/bin/env bash
# Docker for the system test of the real stack (tests/system/test_docker_stack.py) and for trying
# the compose stack on a CPU-only Debian machine without any image registry:
#
#  - Debian packages docker.io (the engine), docker-compose (1.29) and debootstrap;
#  - starts dockerd when no daemon answers (as root; its log goes to the cache folder);
#  - a base image from `debootstrap --variant=minbase bookworm` + `docker import`, with
#    python3 (venv), curl, wget and libgomp1 (the CPU llama-server), trusting the CA
#    certificates this host added in /usr/local/share/ca-certificates (a TLS proxy in front
#    of PyPI and Debian then works inside builds too).
#
# The tarball is cached in $LLMB_DOCKER_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/
# llm-bottleneck/docker); the image is imported once per daemon. Idempotent.
#
#   scripts/install-docker.sh           packages + daemon + base image (what make install runs)
#   scripts/install-docker.sh --print   the base image's name, nothing else
set -euo pipefail

CACHE=${LLMB_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llm-bottleneck/docker}
SUITE=bookworm
BASE_IMAGE=${LLMB_TEST_BASE_IMAGE:-llmb-base:$SUITE-minbase}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
INCLUDE=python3,python3-venv,ca-certificates,curl,wget,libgomp1
if [ "${1:-}" = --print ]; then echo "$BASE_IMAGE"; exit 0; fi
[ -z "${1:-}" ] || { echo "usage: scripts/install-docker.sh [--print]" >&2; exit 2; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
missing=()
for pkg in docker.io docker-compose debootstrap; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "==> apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$CACHE"
# Debian's docker CLI talks to the daemon of the same release (a newer docker binary on
# PATH may not).
DOCKER=/usr/bin/docker
if ! $SUDO "$DOCKER" info >/dev/null 2>&1; then
  echo "==> starting dockerd (log: $CACHE/dockerd.log)"
  if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    $SUDO systemctl start docker
  else
    $SUDO setsid dockerd >"$CACHE/dockerd.log" 2>&1 < /dev/null &
  fi
  for _ in $(seq 60); do
    $SUDO "$DOCKER" info >/dev/null 2>&1 && break
    sleep 1
  done
  $SUDO "$DOCKER" info >/dev/null 2>&1 || {
    echo "dockerd did not start; last lines of $CACHE/dockerd.log:" >&2
    tail -20 "$CACHE/dockerd.log" >&2 || true
    exit 1
  }
fi

TARBALL="$CACHE/$SUITE-minbase.tar"
if [ ! -s "$TARBALL" ]; then
  echo "==> debootstrap --variant=minbase $SUITE (first time only, about 2 minutes)"
  root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap '$SUDO rm -rf "$root"' EXIT
  $SUDO debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap.log"
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    $SUDO cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    $SUDO chroot "$root" update-ca-certificates >/dev/null
  fi
  $SUDO rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  $SUDO tar -C "$root" -cf "$TARBALL.part" .
  mv "$TARBALL.part" "$TARBALL"
fi
if ! $SUDO "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  echo "==> docker import $TARBALL as $BASE_IMAGE"
  # pip reads its own CA bundle unless told to use the system's (which trusts the above).
  $SUDO "$DOCKER" import \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    "$TARBALL" "$BASE_IMAGE" >/dev/null
fi
echo "==> docker: $($SUDO "$DOCKER" version -f '{{.Server.Version}}'), $(docker-compose version --short), base image $BASE_IMAGE"
