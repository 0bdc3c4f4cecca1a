"""Before the job starts: select GPUs, lease them, stop leftover holders, gate them; `doctor`, `gpus`."""
