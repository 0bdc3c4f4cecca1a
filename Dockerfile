# podguard image: the preflight + supervisor as the container's entrypoint, PID-1 safe (tini).
#
# Build it with `make image` / `podguard image build` (they build the wheelhouse on the host first, so
# nothing inside the build needs a package index). Design notes: docs/image.md.
#
# The base: torch's CUDA wheels bring their own CUDA user-space libraries (cuBLAS, cuDNN, NCCL, ... as
# pip packages), so the base needs no CUDA library of its own: `-base` is the smallest CUDA image (cudart
# and the forward-compatibility package, plus the NVIDIA_* variables the container toolkit reads).
# torch 2.13's default Linux wheels are built for CUDA 13.0, which needs an NVIDIA driver >= 580.
# No NVIDIA driver in the image: the container toolkit mounts the host's (libnvidia-ml.so.1, libcuda.so.1).
#
# Stages (no layer of the final image carries the wheels; the legacy builder, which the Docker SDK
# uses, has no `RUN --mount`, so the wheels are installed in build stages and only the result is copied):
#   os    the base + python3/venv/tini/CA certificates/sshd when the base lacks them
#   deps  podguard's dependencies + torch, installed into the virtualenv /opt/podguard
#   app   podguard itself, installed into an empty root (its files at their final paths)
#   final os + the virtualenv + podguard + the entrypoint
ARG BASE_IMAGE=nvidia/cuda:13.0.2-base-ubuntu24.04

FROM ${BASE_IMAGE} AS os
# Packages beyond the ones podguard needs (e.g. "git vim"). Needs the base's apt sources.
ARG EXTRA_APT_PACKAGES=""
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/podguard \
    PATH=/opt/podguard/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Only what the base lacks is installed, so a base that has it all (the tests' local base) needs no apt.
# openssh-server: RunPod's SSH over exposed TCP, started by the entrypoint when PUBLIC_KEY is set.
RUN set -eux; \
    need="${EXTRA_APT_PACKAGES}"; \
    command -v python3 >/dev/null 2>&1 || need="$need python3"; \
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need="$need python3-venv"; \
    [ -x /usr/bin/tini ] || need="$need tini"; \
    [ -e /etc/ssl/certs/ca-certificates.crt ] || need="$need ca-certificates"; \
    [ -x /usr/sbin/sshd ] || need="$need openssh-server"; \
    if [ -n "$(echo $need)" ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends $need; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    rm -f /etc/ssh/ssh_host_*; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), "podguard needs Python >= 3.11, the base has " + sys.version'; \
    mkdir -p /workspace; \
    chmod 1777 /workspace

FROM os AS deps
COPY docker/wheelhouse/deps/ /tmp/wheelhouse/deps/
RUN set -eux; \
    python3 -m venv "$VIRTUAL_ENV"; \
    pip install --no-index --find-links /tmp/wheelhouse/deps /tmp/wheelhouse/deps/*.whl

FROM deps AS app
COPY docker/wheelhouse/app/ /tmp/wheelhouse/app/
RUN set -eux; \
    pip install --no-index --no-deps --root /staging /tmp/wheelhouse/app/*.whl; \
    mkdir -p /staging/usr/local/bin; \
    ln -s "$VIRTUAL_ENV/bin/podguard" /staging/usr/local/bin/podguard

FROM os
# Dependencies first (torch is the big layer): a change to podguard's own code does not touch it.
COPY --from=deps /opt/podguard /opt/podguard
COPY --from=app /staging/ /
COPY docker/rootfs/ /
RUN podguard --version

WORKDIR /workspace

# Cheap and CUDA-free: NVML checks only, never a CUDA context in the health check.
HEALTHCHECK --interval=60s --timeout=20s --start-period=30s --retries=3 \
    CMD ["podguard", "health", "--probe", "off"]

# tini is PID 1: it reaps every zombie (also during the preflight, before podguard becomes a subreaper)
# and, with -g, forwards SIGTERM/SIGINT to the whole foreground process group, so a `bash -c "..."`
# start command cannot swallow the signal. podguard's workers run in their own process groups and get
# the signal from podguard (forward, grace, kill), exactly once.
ENTRYPOINT ["/usr/bin/tini", "-g", "--", "/usr/local/bin/podguard-entrypoint"]
CMD []

# Last, so that new values never invalidate the layers above.
ARG BASE_IMAGE
ARG PODGUARD_VERSION=unknown
ARG PODGUARD_REVISION=unknown
ARG PODGUARD_SOURCE=unknown
LABEL org.opencontainers.image.title="podguard" \
      org.opencontainers.image.description="GPU training entrypoint: cleanup, GPU selection, health gate, supervised launch" \
      org.opencontainers.image.version="${PODGUARD_VERSION}" \
      org.opencontainers.image.revision="${PODGUARD_REVISION}" \
      org.opencontainers.image.source="${PODGUARD_SOURCE}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
