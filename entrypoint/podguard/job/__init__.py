"""The job: one `podguard train|run` from its configuration to its END line, restarts included.

    code = conduct(["python", "train.py"], launch_options, preflight_opts)   # job/conductor.py: the CLI's one call

`configure.py` makes every exit-64 check of the options and the environment, before anything runs, into one
composed `JobSettings`; `conductor.py` reads like the lifecycle (configure -> attempt -> preflight -> launch ->
watch -> outcome -> restart or end); `ending.py` says the one END line; `attempt.py` launches one attempt under the
run-time watches; `restarts.py` decides about relaunches (pure); `restart_guard.py` and `outcomes.py` are the
restart guard of a restarted container and its records; `multinode.py` is where the preflight meets the cluster
gate of a multi-node job; `handoff.py` and `store.py` hand each attempt its checkpoint; `sweep.py` runs N jobs of
K GPUs on one node. The END/RESTART lines a keeper reads are formatted in `podguard/outcome_lines.py`.
This package is the glue between preflight/ and launch/ (which never import each other); the CLI only parses.
"""
