"""torchrun mode: the agent command line and the recovery of the real failing rank."""
