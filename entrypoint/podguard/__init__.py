"""podguard: make GPU training start reliably on RunPod and any Docker GPU host.

This package must stay cheap to import: the preflight path never imports torch, runpod or docker.
"""

__version__ = "0.1.0"
