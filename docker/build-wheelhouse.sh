#!/usr/bin/env bash
# Build the image's wheelhouse on the host, so that `docker build` installs everything with
# `pip install --no-index` (no package index or HTTPS needed inside the build). `podguard image build`
# (and so `make image`) runs it with the image's Python; it can also be run alone.
#
#   docker/build-wheelhouse.sh [OUT]    (default OUT: docker/wheelhouse)
#
# OUT/app/   podguard's own wheel, rebuilt every time (cheap)
# OUT/deps/  what the image installs and nothing more: podguard's core requirements and its `store` extra
#            (--checkpoint-store's S3 client; not the laptop extras pods/image) + torch, for the image's
#            Python; cached: re-resolved only when pyproject.toml, TORCH_SPEC or IMAGE_PYTHON change
# OUT/deps-base/  with TORCH_SPEC=base (`--torch base`: the base image brings Python and torch): the core
#            requirements without torch, plus a pip wheel (the build runs pip from it, so the base needs
#            no pip of its own and the image gets none); cached in the same way
#
# Environment: IMAGE_PYTHON (the base image's python3 version, e.g. 3.12; default: the host pip's),
# TORCH_SPEC (default torch==2.13.0: on Linux x86_64 PyPI resolves it to the CUDA 13 build; this project's
# CI machines carry a CPU build of it on disk; `base`: no torch, see deps-base above),
# PIP (default: python3 -m pip). pip's own settings
# (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, e.g. PyTorch's CUDA 12 index) apply here, on the host only.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docker/wheelhouse}
pip=${PIP:-python3 -m pip}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
image_python=${IMAGE_PYTHON:-$($pip --version | sed -E 's/.*\(python ([0-9]+\.[0-9]+)\).*/\1/')}
arch=$(uname -m)

mkdir -p "$out/app"
rm -f "$out"/app/*.whl
# A fixed timestamp makes the wheel reproducible: unchanged sources keep Docker's layer cache.
SOURCE_DATE_EPOCH=315532800 $pip wheel -q --no-deps -w "$out/app" .

key=$(printf '%s\n%s\n%s\n' "$(sha256sum pyproject.toml)" "$torch_spec" "$image_python-$arch" | sha256sum | cut -d' ' -f1)
app="$(ls "$out"/app/podguard-*.whl)"
if [ "$torch_spec" = base ]; then
  deps="$out/deps-base"
  extra=(pip py-spy==0.4.3)  # py-spy: the hang watch's stacks (launch/watch/stacks.py), ~8 MB, no dependencies
  # (no `store` extra: boto3 is ~36 MB installed, past the 30 MB a `--torch base` image may add; such an image
  # says `pip install 'podguard[store]'` when --checkpoint-store s3://... is asked for)
else
  deps="$out/deps"
  extra=("$torch_spec" py-spy==0.4.3)
  app="$app[store]"  # --checkpoint-store's S3 client (boto3)
fi
# Binary wheels for the image's Python and any glibc up to 2.35 (Ubuntu 22.04; Debian 12 has 2.36).
platforms=()
for tag in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 \
  manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1 linux; do
  platforms+=(--platform "${tag}_${arch}")
done
if [ "$(cat "$deps/.key" 2>/dev/null || true)" = "$key" ]; then
  echo "wheelhouse: dependencies cached ($deps, python $image_python)"
  exit 0
fi
rm -rf "$deps"
mkdir -p "$deps"
echo "wheelhouse: resolving podguard's dependencies + ${extra[*]} for python $image_python ($arch)"
# The local wheel by path: a package of the same name on an index must never be picked instead.
if ! $pip download -q --only-binary=:all: --python-version "$image_python" --implementation cp "${platforms[@]}" \
  -d "$deps" "$app" "${extra[@]}" >"$out/download.log" 2>&1; then
  grep -v '^WARNING: Location' "$out/download.log" >&2
  echo "wheelhouse: resolving the dependencies failed (log: $out/download.log)" >&2
  exit 1
fi
rm -f "$deps"/podguard-*.whl
echo "$key" >"$deps/.key"
echo "wheelhouse: $(ls "$deps"/*.whl | wc -l) wheels in $deps"
