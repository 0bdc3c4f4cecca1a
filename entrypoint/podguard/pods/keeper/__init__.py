"""`podguard pod keep`: keep a job alive from outside its pod (PRODUCT.md, "Keeping a job alive from outside").

    lines.py    podguard's own lines in the pod's log (verdict, END, RESTART, guard) as cues
    decide.py   what to do from the status and the cues: wait, start, replace, finish (pure)
    target.py   a pod or a cluster behind one interface, on the pod/cluster layers `pod up`/`heal` use
    loop.py     the loop: one status request per poll, one log stream per node, each step recorded first
    recovery.py starts and replacements (the name looked up before any create: adopted, never duplicated)
    ending.py   the end: the decision recorded first, "done" only once the stop is confirmed
    twins.py    several pods (clusters) of one name: which one stays
    record.py   the state file (resumable), the event record, one keeper per name
    events.py   a terminal line, a record and a webhook per event
    notify.py   `--notify`: Slack/Discord-compatible JSON posts, never the key
    deploy.py   `--deploy`: the keeper as a CPU pod; `pod status`/`pod down` of a kept pod
    options.py  the options and tuning knobs, checked before any request
    command.py  the command's body (cli/pods.py stays thin)

Design and user guide: docs/running-pods.md ("Keeping a job alive overnight").
"""
