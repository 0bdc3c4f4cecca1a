"""The built-in demo training job: what `podguard train` runs when given no command.

A small real model (a residual MLP) learning a synthetic classification task, using every training
helper podguard ships: `init_rank`, the import lock around `import torch`, memory phase logging,
prepare-once for the dataset, DDP (NCCL over the selected GPUs, or gloo over CPU processes), a progress
line with throughput and ETA, the NaN guard and a final summary.

Run it standalone (`python -m podguard.demo`), under torchrun, or under podguard's per-gpu launcher:
it reads RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT when they are set and runs as a
single process when they are not. Importing this package does not import torch.
"""
