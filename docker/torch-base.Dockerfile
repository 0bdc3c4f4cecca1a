# podguard on the user's own image: `podguard image build --base IMAGE --torch base`.
#
# The base brings Python (its `python3`, first on PATH) and torch; podguard adds only itself, its core
# dependencies (typer, nvidia-ml-py), tini and the entrypoint, so the image carries exactly one torch: the
# base's. podguard lives in its own virtualenv /opt/podguard, made from the base's interpreter, with a .pth
# file that adds the base's site-packages after its own: podguard's processes (the demo, the CUDA probe)
# import the base's torch, and the user's `python train.py` runs on the base's environment untouched
# (nothing of podguard's is on the base's sys.path or PATH but /usr/local/bin/podguard). Design notes:
# docs/image.md ("--torch base").
#
# Stages (as in the Dockerfile next to docker/: no layer of the final image carries a wheel):
#   os    the base + tini/sshd/CA certificates when it lacks them and has apt
#   deps  the virtualenv: podguard's core dependencies, installed by a pip run from its wheel
#   app   podguard itself, installed into an empty root (its files at their final paths)
#   final os + the virtualenv + podguard + the entrypoint; the base's ENV, WORKDIR and USER-less root stay
ARG BASE_IMAGE

FROM ${BASE_IMAGE} AS os
# Building needs root; the base's environment (PATH, VIRTUAL_ENV, CONDA_*) and working directory are kept.
USER root
# tini (PID 1) is required; sshd (PUBLIC_KEY) and CA certificates (the REST client's HTTPS) are installed
# when missing, where the base has apt and its sources answer. A base that has them needs no apt.
RUN set -eu; \
    need=""; \
    [ -x /usr/bin/tini ] || need="$need tini"; \
    [ -x /usr/sbin/sshd ] || need="$need openssh-server"; \
    [ -e /etc/ssl/certs/ca-certificates.crt ] || need="$need ca-certificates"; \
    if [ -n "$need" ]; then \
        if command -v apt-get >/dev/null 2>&1; then \
            { DEBIAN_FRONTEND=noninteractive apt-get update -q \
              && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $need; } \
              || echo "podguard: apt-get could not install:$need"; \
            rm -rf /var/lib/apt/lists/*; \
        else \
            echo "podguard: the base lacks$need and has no apt-get"; \
        fi; \
    fi; \
    if [ ! -x /usr/bin/tini ]; then \
        echo "podguard: the base has no /usr/bin/tini and it could not be installed; add it to the base (apt-get install tini)" >&2; \
        exit 1; \
    fi; \
    [ -x /usr/sbin/sshd ] || echo "podguard: no sshd in this image: PUBLIC_KEY will not start an SSH server"; \
    if ls /etc/ssh/ssh_host_* >/dev/null 2>&1; then rm -f /etc/ssh/ssh_host_*; fi; \
    [ -d /workspace ] || { mkdir -p /workspace && chmod 1777 /workspace; }

FROM os AS deps
COPY docker/wheelhouse/deps-base/ /tmp/wheelhouse/deps/
# The base's python3 (first on PATH) makes the venv, so podguard runs on the same interpreter as the
# training job. The .pth runs `site.addsitedir` for each of the base interpreter's site directories (its
# own .pth files are honoured too): after the venv's own, so podguard's dependencies win for podguard.
RUN set -eu; \
    python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "podguard needs Python >= 3.11, the base has " + sys.version)'; \
    python3 -m venv --without-pip /opt/podguard; \
    purelib=$(/opt/podguard/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
    python3 -c 'import os, site; dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]; print("import site; " + "; ".join("site.addsitedir(%r)" % d for d in dirs if os.path.isdir(d)))' \
        > "$purelib/podguard-base-site.pth"; \
    PYTHONDONTWRITEBYTECODE=1 /opt/podguard/bin/python -c 'import torch.version' \
        || { echo "podguard: the venv made from the base's python3 cannot import torch" >&2; exit 1; }; \
    pip_wheel=$(ls /tmp/wheelhouse/deps/pip-*.whl); \
    names=$(ls /tmp/wheelhouse/deps/*.whl | sed 's#.*/##; s/-.*//' | grep -vx pip); \
    /opt/podguard/bin/python "$pip_wheel/pip" install -q --no-index --find-links /tmp/wheelhouse/deps \
        --ignore-installed --disable-pip-version-check --no-cache-dir --no-warn-script-location $names

FROM deps AS app
COPY docker/wheelhouse/app/ /tmp/wheelhouse/app/
RUN set -eu; \
    pip_wheel=$(ls /tmp/wheelhouse/deps/pip-*.whl); \
    /opt/podguard/bin/python "$pip_wheel/pip" install -q --no-index --no-deps --root /staging \
        --disable-pip-version-check --no-cache-dir --no-warn-script-location /tmp/wheelhouse/app/*.whl; \
    mkdir -p /staging/usr/local/bin; \
    ln -s /opt/podguard/bin/podguard /staging/usr/local/bin/podguard

FROM os
COPY --from=deps /opt/podguard /opt/podguard
COPY --from=app /staging/ /
COPY docker/rootfs/ /
RUN PYTHONDONTWRITEBYTECODE=1 podguard --version

# As in the Dockerfile: NVML checks only, tini as PID 1 with process-group signals, `train` by default.
HEALTHCHECK --interval=60s --timeout=20s --start-period=30s --retries=3 \
    CMD ["podguard", "health", "--probe", "off"]
ENTRYPOINT ["/usr/bin/tini", "-g", "--", "/usr/local/bin/podguard-entrypoint"]
CMD []

ARG BASE_IMAGE
ARG PODGUARD_VERSION=unknown
ARG PODGUARD_REVISION=unknown
ARG PODGUARD_SOURCE=unknown
LABEL org.opencontainers.image.title="podguard" \
      org.opencontainers.image.description="GPU training entrypoint: cleanup, GPU selection, health gate, supervised launch" \
      org.opencontainers.image.version="${PODGUARD_VERSION}" \
      org.opencontainers.image.revision="${PODGUARD_REVISION}" \
      org.opencontainers.image.source="${PODGUARD_SOURCE}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.podguard.torch="base"
