#!/usr/bin/env bash
# Build the torch-bearing base the `--torch base` tests use: the tests' Debian base (build-base-image.sh) plus
# a conda-style Python prefix /opt/conda (a venv of the Debian python3 3.11, with pip) that holds torch,
# first on PATH, the way the official PyTorch images put /opt/conda/bin first. Offline: torch and its
# dependencies are downloaded on the host (this machine's pip finds the CPU build on its disk).
#
#   tests/image/support/build-torch-base.sh [TAG] [FROM]
#   (defaults: podguard-test-torchbase:bookworm, podguard-test-base:bookworm; TORCH_SPEC default torch==2.13.0)
#
# Cached: does nothing when TAG exists and was built from the same FROM image and torch spec (its
# io.podguard.base-key label). The wheels are installed in a build stage: no layer carries them.
set -euo pipefail
tag=${1:-podguard-test-torchbase:bookworm}
from=${2:-podguard-test-base:bookworm}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
pip=${PIP:-python3 -m pip}
from_id=$(docker image inspect -f '{{ .Id }}' "$from")
key=$(printf '%s %s %s v1' "$from_id" "$torch_spec" "$(uname -m)" | sha256sum | cut -c1-16)

have=$(docker image inspect -f '{{ index .Config.Labels "io.podguard.base-key" }}' "$tag" 2>/dev/null || true)
if [ "$have" = "$key" ]; then
  echo "torch base image: $tag cached"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/podguard-torchbase.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
py=$(docker run --rm --entrypoint python3 "$from" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
echo "torch base image: downloading $torch_spec for python $py"
mkdir -p "$work/wheels"
$pip download -q --only-binary=:all: --python-version "$py" --implementation cp \
  --platform "manylinux_2_28_$(uname -m)" --platform "manylinux2014_$(uname -m)" \
  -d "$work/wheels" "$torch_spec" >"$work/download.log" 2>&1 || {
  cat "$work/download.log" >&2
  echo "torch base image: downloading $torch_spec failed" >&2
  exit 1
}
cat >"$work/Dockerfile" <<EOF
FROM $from AS install
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /opt/conda && /opt/conda/bin/pip install -q --no-index --no-cache-dir \
      --disable-pip-version-check --find-links /tmp/wheels "$torch_spec"
FROM $from
COPY --from=install /opt/conda /opt/conda
ENV PATH=/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL io.podguard.base-key=$key
EOF
echo "torch base image: building $tag from $from"
if ! docker build -q -t "$tag" "$work" >"$work/build.log" 2>&1; then
  tail -n 30 "$work/build.log" >&2
  echo "torch base image: docker build failed" >&2
  exit 1
fi
echo "torch base image: $tag built in $(($(date +%s) - start)) s"
