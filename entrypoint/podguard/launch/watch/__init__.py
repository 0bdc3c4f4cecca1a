"""The run-time watches: what podguard learns about a job while it runs (docs/watch.md).

One module per concern, each usable on its own and driven from the supervisor's single loop (no thread per
worker): progress and hangs (`hangs.py`, heartbeats from `podguard.rank.heartbeat`), GPU faults
(`gpu_faults.py`: NVML events and queries in podguard's own process), stragglers (`stragglers.py`), and the
evidence kept when a job is hung (`stacks.py`: every worker's Python stacks from outside; `flight.py`: torch's
NCCL flight recorder). docs/watch.md explains the rules and their sources.
"""
