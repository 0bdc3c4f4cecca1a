#!/usr/bin/env bash
# Build the local base image the image tests use (no registry can be reached on the CI machines):
# debootstrap a minimal Debian bookworm with what the Dockerfile would otherwise apt-get (python3, venv,
# tini, CA certificates, openssh-server for the PUBLIC_KEY/sshd tests), then `docker import` it.
#
#   tests/image/support/build-base-image.sh [TAG]     (default TAG: podguard-test-base:bookworm)
#
# Cached: does nothing when TAG exists and was built from the same package list (the image's
# io.podguard.base-key label), so changing the list below rebuilds it. The mirror is the one this
# machine's apt uses (/etc/apt/sources.list*), else deb.debian.org; override with DEBIAN_MIRROR.
# Needs root, debootstrap and a running Docker engine.
set -euo pipefail
tag=${1:-podguard-test-base:bookworm}
suite=${DEBIAN_SUITE:-bookworm}
packages=python3,python3-venv,tini,ca-certificates,openssh-server
key=$(printf '%s %s v2' "$suite" "$packages" | sha256sum | cut -c1-16)

have=$(docker image inspect -f '{{ index .Config.Labels "io.podguard.base-key" }}' "$tag" 2>/dev/null || true)
if [ "$have" = "$key" ]; then
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
echo "base image: debootstrap $suite ($packages) from $mirror"
start=$(date +%s)
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
  tail -n 30 "$work/debootstrap.log" >&2
  tail -n 30 "$work/rootfs/debootstrap/debootstrap.log" 2>/dev/null >&2 || true
  echo "base image: debootstrap failed" >&2
  exit 1
fi
# Smaller image, faster import: no package cache, lists, docs or locales. No host keys either: a base
# image must not ship SSH host keys (every container would share them); the entrypoint makes its own.
rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/* \
  "$work"/rootfs/usr/share/doc/* "$work"/rootfs/usr/share/man/* "$work"/rootfs/usr/share/locale/* \
  "$work"/rootfs/etc/ssh/ssh_host_*
tar -C "$work/rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL io.podguard.base-key=$key" \
  --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "base image: $tag built in $(($(date +%s) - start)) s"
