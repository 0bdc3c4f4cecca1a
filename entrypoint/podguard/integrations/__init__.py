"""Small callbacks that connect a training framework to podguard: heartbeats, the save on `--save-signal`, the
resume from PODGUARD_RESUME_FROM (docs/checkpoints.md). Each module imports its framework when it is imported
itself, with one clear ImportError when the framework is missing: podguard depends on none of them.

    from podguard.integrations.hf import PodguardCallback           # Hugging Face Trainer
    from podguard.integrations.lightning import PodguardCallback    # Lightning
"""

from __future__ import annotations

__all__: list[str] = []
