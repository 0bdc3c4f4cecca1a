"""Host-side image tooling: build, run and smoke-test podguard's container image through the Docker SDK.

The only package that imports `docker` (the SDK), and only inside the functions that talk to the engine,
so `podguard train` and the other in-container commands never pay for it. Design: docs/image.md.

    podguard image build --base podguard-test-base:bookworm --tag podguard-test:latest
    podguard image run --spec runpod/pod.toml --gpus 0,1
    podguard image smoke podguard-test:latest
"""

# Labels podguard puts on what it creates, so that it can find (and replace) its own containers later.
LABEL_MANAGED = "io.podguard.managed"
LABEL_POD = "io.podguard.pod"

__all__ = ["LABEL_MANAGED", "LABEL_POD"]
