"""`podguard pod keep`: keep a job alive from outside its pod, as a reconciler (docs/running-pods.md, "Keeping a job
alive overnight" and "How the keeper decides").

The rules (pure, no I/O; mutation-tested):
    converge.py     of one listing of the name, the one pod (cluster) kept; surplus, strangers, unknown, missing
    decide.py       what to do with the one kept, from its status and podguard's lines: wait, start, replace, finish
    intent.py       the user's word (kept / down / stopped / done) and its generations: who may act
    spec_change.py  what changed in the spec since a pod was made from it, in words
    lines.py        podguard's own lines in the pod's log (verdict, END, RESTART, guard) as cues

The keeper:
    loop.py         the loop: one listing per poll, one log stream per node; ends on a newer word of the user
    reconcile.py    each poll's first step: strangers named, surplus terminated, the one kept adopted, the first create
    recovery.py     starts and replacements (remove, then create; one of its own made meanwhile is adopted)
    ending.py       the end: recorded first, `done` only once the stop reads back, then `done` in the record
    kept.py         the pod kept, poll to poll, over pods/target.py (kept_cluster.py: a cluster); one listing a poll
    actuate.py      the hands: every create, start, stop, terminate fenced and read back; creates and starts leased
    fence.py        the user's word read again before every action; leases for `pod down`
    intent_store.py where the word lives: a RunPod template per name, the one place every actor can read
    registry.py     the keepers on this machine, whatever their HOME: locks that prove a pid, leases of creates
    record.py       the local state (resumable, never the truth) and the event record
    events.py       a terminal line, a record and a webhook per event; notify.py: `--notify`

Around it:
    command.py      the command's body: checks, one keeper per machine, the claim, the keeper, its end
    claim.py        before a keep begins: strangers, a kind change, a keeper pod alive or lost, the word written
    deploy.py       `--deploy`: the keeper as a CPU pod; who keeps a name (`pod status`)
    sweep.py        `pod down` / `pod stop`: the word, every keeper ended, a sweep until nothing can bill
    down.py         which pod (cluster) `pod down REF` / `pod stop REF` names, and what is said
    options.py      the options and tuning knobs, checked before any request
    interrupt.py    SIGTERM/SIGHUP as an interruption, held while a create (start) is in flight
"""
