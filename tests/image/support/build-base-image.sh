#!/usr/bin/env bash
# Build the local base image the image tests use (no registry can be reached on the CI machines):
# debootstrap a minimal Debian bookworm with python3, venv, pip, tini and CA certificates, then
# `docker import` it. Cached: does nothing when the image already exists.
#
#   tests/image/support/build-base-image.sh [TAG]     (default TAG: podguard-test-base:bookworm)
#
# The mirror is the one this machine's apt uses (/etc/apt/sources.list*), else deb.debian.org;
# override with DEBIAN_MIRROR. Needs root, debootstrap and a running Docker engine.
set -euo pipefail
tag=${1:-podguard-test-base:bookworm}
suite=${DEBIAN_SUITE:-bookworm}

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image: $tag cached"
  exit 0
fi
command -v debootstrap >/dev/null 2>&1 || { echo "base image: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  # The first Debian main-archive URI apt is configured with (deb822 `URIs:` or one-line `deb URI suite`).
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    grep -v '^[[:space:]]*#' | grep -oE 'https?://[^[:space:]]+/debian/?([[:space:]]|$)' | grep -v security |
    head -n1 | tr -d '[:space:]' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/podguard-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "base image: debootstrap $suite from $mirror"
start=$(date +%s)
if ! debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,tini,ca-certificates \
  "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
  tail -n 30 "$work/debootstrap.log" >&2
  cat "$work/rootfs/debootstrap/debootstrap.log" 2>/dev/null | tail -n 30 >&2 || true
  echo "base image: debootstrap failed" >&2
  exit 1
fi
# Smaller image, faster import: no package cache, lists, docs or locales.
rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/* \
  "$work"/rootfs/usr/share/doc/* "$work"/rootfs/usr/share/man/* "$work"/rootfs/usr/share/locale/*
tar -C "$work/rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "base image: $tag built in $(($(date +%s) - start)) s"
