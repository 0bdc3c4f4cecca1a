"""Launching and supervising the job: single, per-gpu, torchrun and roles modes."""
