"""Find what holds the selected GPUs and stop it safely: /proc evidence, the plan, pidfd signals, the idle wait."""
