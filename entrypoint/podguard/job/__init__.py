"""The job's conductor: one `podguard train|run` from its start to its end, restarts included.

    code = run_job_flow(cfg, preflight_opts)       # job/conductor.py

`conductor.py` reads like the lifecycle (attempt -> preflight -> launch -> watch -> outcome -> restart or end);
`attempt.py` launches one attempt under the run-time watches; `restarts.py` decides about relaunches (pure);
`cluster.py` is where the preflight meets the cluster gate; `handoff.py` hands each attempt its checkpoint.
The END/RESTART lines a keeper reads are formatted in `podguard/outcome_lines.py`.
This package is the glue between preflight/ and launch/ (which never import each other); the CLI only parses.
"""
