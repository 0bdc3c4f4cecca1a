# podguard image: the preflight + supervisor as the container's entrypoint, PID-1 safe (tini).
#
# Build with `make image` (it builds the wheelhouse on the host first, so nothing inside the build needs
# a package index):
#   make image                                   # default CUDA base, TORCH_SPEC=torch for a CUDA torch
#   make image BASE_IMAGE=podguard-test-base:bookworm   # the local Debian base the tests build
#
# No NVIDIA driver in the image: the NVIDIA container runtime mounts the host's driver (libnvidia-ml.so.1,
# libcuda.so.1) into the container. A driver installed here causes "driver/library version mismatch".
ARG BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

# Packages added on top of whatever python3/venv/tini/ca-certificates the base lacks (those are only
# installed when missing, so a base that has them needs no apt at all). openssh-server: RunPod's SSH
# over exposed TCP (started by the entrypoint when PUBLIC_KEY is set). Tests pass an empty value.
ARG EXTRA_APT_PACKAGES="openssh-server"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/podguard \
    PATH=/opt/podguard/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

RUN set -eux; \
    need=""; \
    command -v python3 >/dev/null 2>&1 || need="$need python3"; \
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need="$need python3-venv"; \
    [ -x /usr/bin/tini ] || need="$need tini"; \
    [ -e /etc/ssl/certs/ca-certificates.crt ] || need="$need ca-certificates"; \
    need="$need ${EXTRA_APT_PACKAGES}"; \
    if [ -n "$(echo $need)" ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends $need; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), "podguard needs Python >= 3.11, the base has " + sys.version'; \
    python3 -m venv "$VIRTUAL_ENV"; \
    mkdir -p /workspace; \
    chmod 1777 /workspace

# Dependencies first (torch is the big layer): a change to podguard's own code does not reinstall them.
COPY docker/wheelhouse/deps/ /tmp/wheelhouse/deps/
RUN set -eux; \
    pip install --no-index --find-links /tmp/wheelhouse/deps /tmp/wheelhouse/deps/*.whl; \
    rm -rf /tmp/wheelhouse/deps

COPY docker/wheelhouse/app/ /tmp/wheelhouse/app/
COPY docker/entrypoint.sh /usr/local/bin/podguard-entrypoint
RUN set -eux; \
    pip install --no-index --no-deps /tmp/wheelhouse/app/*.whl; \
    rm -rf /tmp/wheelhouse; \
    chmod 0755 /usr/local/bin/podguard-entrypoint; \
    ln -sf "$VIRTUAL_ENV/bin/podguard" /usr/local/bin/podguard; \
    podguard --version

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
