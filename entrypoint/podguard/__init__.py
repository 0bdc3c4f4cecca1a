"""podguard: make GPU training start reliably on RunPod and any Docker GPU host.

This package must stay cheap to import: the preflight path never imports torch, runpod or docker.
"""

# The one place the version lives: pyproject.toml reads it (setuptools dynamic version), `podguard --version`
# prints it, `podguard image build` labels and tags the image with it. A release changes it here and names it in
# CHANGELOG.md (docs/development.md, "Releasing").
__version__ = "0.1.0"
