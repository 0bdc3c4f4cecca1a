"""Every command-line option of the node and launch commands, declared once: flags, environment variables,
parser, help. A field of the record (with its default) plus a `Param` here is a new option.

    @options(PREFLIGHT, ("gpu_list", "grace_s"), into="opts", command="cleanup")
"""

from __future__ import annotations

from pathlib import Path

from podguard.checkpoints.option import checkpoints_dir
from podguard.cli import option_values as values
from podguard.cli.params import Group, Param, choice, count, parse_int, ratio, seconds, whole, words
from podguard.durations import DURATION_HELP, parse_duration, parse_usd
from podguard.job.options import JobOptions
from podguard.launch.config import LaunchMode, OnExit
from podguard.preflight.options import DegradedPolicy, OnFewer, PreflightOptions, ProbeMode
from podguard.store.url import parse_store_url

__all__ = ["LAUNCH", "PREFLIGHT"]

PREFLIGHT_PANEL = "Preflight"
LAUNCH_PANEL = "Launch"
GUARDS_PANEL = "Billing guards"
RUN_PANEL = "During the run"

PREFLIGHT = Group(
    PreflightOptions,
    {
        "gpu_list": Param(
            ("--gpu-list",),
            "GPUs to use: NVML indices or UUIDs, e.g. 0,1,2,3. Default: CUDA_VISIBLE_DEVICES, else all.",
            ("PODGUARD_GPU_LIST", "GPU_LIST"),
        ),
        "nproc_per_node": Param(
            ("--nproc-per-node",),
            "Use this many GPUs (caps the selection; more than selected fails unless --on-fewer-gpus continue).",
            ("PODGUARD_NPROC_PER_NODE", "NPROC_PER_NODE"),
            parse=count("NPROC_PER_NODE", 1),
            metavar="N",
        ),
        "expect_gpus": Param(
            ("--expect-gpus",),
            "GPUs this node should have (default: RUNPOD_GPU_COUNT).",
            ("PODGUARD_EXPECT_GPUS", "RUNPOD_GPU_COUNT"),
            parse=count("expect-gpus", 0),
            metavar="N",
        ),
        "on_fewer": Param(
            ("--on-fewer-gpus",),
            "fail (exit 69) or continue (loudly) when fewer GPUs than expected.",
            ("PODGUARD_ON_FEWER_GPUS",),
            type=str,
            parse=choice(OnFewer, "on-fewer-gpus"),
            metavar="fail|continue",
        ),
        "require_gpu": Param(
            ("--require-gpu/--allow-cpu",), "No GPU at all is an error (69) instead of a CPU fallback.", type=bool
        ),
        "cleanup": Param(
            ("--cleanup/--no-cleanup",),
            "Stop leftover processes that hold the selected GPUs before starting.",
            type=bool,
        ),
        "dry_run": Param(("--dry-run",), "Report what would be stopped; kill nothing.", type=bool),
        "busy_timeout_s": Param(
            ("--busy-timeout",),
            "Seconds to wait for busy GPUs to become free before giving up (exit 75).",
            ("PODGUARD_BUSY_TIMEOUT",),
            type=str,
            parse=seconds("--busy-timeout"),
            metavar="SECONDS",
        ),
        "grace_s": Param(
            ("--grace",),
            "Seconds between SIGTERM and SIGKILL when stopping processes.",
            ("PODGUARD_GRACE",),
            type=str,
            parse=seconds("--grace"),
            metavar="SECONDS",
        ),
        "protect": Param(
            ("--protect",),
            "Process name never to stop (repeatable; added to sshd, jupyter, nginx, ...).",
            type=list[str] | None,
            parse=words,
            metavar="NAME",
        ),
        "kill_patterns": Param(
            ("--kill-pattern",),
            "Launcher name (e.g. sglang, torchrun) whose job tree is stopped when one of its processes holds a GPU.",
            ("PODGUARD_KILL_PATTERN",),
            type=list[str] | None,
            parse=words,
            metavar="NAME",
        ),
        "idle_memory_mib": Param(
            ("--idle-memory-mib",),
            "GPU memory in use at or below this, with no process, counts as idle.",
            type=str,
            parse=whole("--idle-memory-mib"),
            metavar="MIB",
        ),
        "probe": Param(
            ("--probe",),
            "Health probe: cuda (a child per GPU runs a checked matmul and measures matmul/memory/host-copy speed), "
            "full (cuda plus one all-reduce across the GPUs), off (NVML only), auto: cuda where this Python has a CUDA "
            "build of torch and an NVIDIA driver is present (or --probe-cmd is given), else off.",
            type=str,
            parse=choice(ProbeMode, "PODGUARD_PROBE"),
            metavar="auto|cuda|full|off",
        ),
        "probe_cmd": Param(
            ("--probe-cmd",), "Your own probe program, run per GPU with only that GPU visible (exit 0 = healthy)."
        ),
        "probe_timeout_s": Param(
            ("--probe-timeout",),
            "Seconds before a hung probe is killed and its GPU marked unhealthy.",
            ("PODGUARD_PROBE_TIMEOUT",),
            type=str,
            parse=seconds("--probe-timeout"),
            metavar="SECONDS",
        ),
        "max_temperature_margin_c": Param(
            ("--temperature-margin",),
            "Warn when a GPU is within this many degrees C of its slowdown temperature.",
            ("PODGUARD_TEMPERATURE_MARGIN",),
            type=str,
            parse=whole("--temperature-margin"),
            metavar="DEGREES",
        ),
        "fail_on_warnings": Param(
            ("--fail-on-warnings",),
            "Treat gate warnings (ECC off, corrected ECC errors, degraded GPUs under --degraded warn) as failures.",
            type=bool,
        ),
        "degraded": Param(
            ("--degraded",),
            "A degraded GPU (hardware slowdown, at slowdown temperature, narrow PCIe link, NVLink down, slow): "
            "fail (76), warn (pass with a warning), exclude (run on the rest when they still meet the count).",
            ("PODGUARD_DEGRADED",),
            type=str,
            parse=choice(DegradedPolicy, "PODGUARD_DEGRADED"),
            metavar="fail|warn|exclude",
        ),
        "slow_ratio": Param(
            ("--slow-ratio",),
            "A probe metric below this fraction of the median of the node's GPUs of its model is a slow GPU; 0 turns "
            "this relative check off (the floors still apply).",
            ("PODGUARD_SLOW_RATIO",),
            type=str,
            parse=ratio("PODGUARD_SLOW_RATIO"),
            metavar="RATIO",
        ),
        "wait_for_gpus": Param(
            ("--wait-for-gpus",),
            "Wait (up to --busy-timeout) for GPUs leased by another podguard run instead of refusing (75).",
            type=bool,
            panel=LAUNCH_PANEL,
        ),
        "state_dir": Param(
            ("--state-dir",),
            "Where reports, logs, locks and leases live (default /workspace/.podguard when /workspace exists).",
            type=Path | None,
            panel=None,
        ),
        "dev_dir": Param(
            ("--dev-dir",), "Where the NVIDIA device files are looked for when finding GPU holders.", type=Path
        ),
    },
    from_env={"cuda_visible_devices": "CUDA_VISIBLE_DEVICES"},
)

LAUNCH = Group(
    JobOptions,
    {
        "mode": Param(
            ("--mode",),
            "auto: torchrun when CMD is a Python script or module (python x.py, python -m pkg) and 2+ GPUs are "
            "selected, or on several nodes; else single (one GPU, CPU only, any other command); the demo runs "
            "per-gpu, a --job-file roles. single (one process, all selected GPUs), per-gpu (one process per GPU), "
            "torchrun, roles (a --job-file splits GPUs between roles).",
            type=str,
            parse=choice(LaunchMode, "--mode"),
            metavar="auto|single|per-gpu|torchrun|roles",
            panel=LAUNCH_PANEL,
        ),
        "only_gpu": Param(
            ("--only-gpu",),
            "Show only this GPU's (or rank's) lines on the terminal; every line still goes to the log files.",
            parse=lambda raw: None if raw in (None, "") else values.gpu_index(raw),
            metavar="GPU",
            panel=LAUNCH_PANEL,
        ),
        "prefix": Param(
            ("--prefix",),
            "Per-line prefix of per-gpu workers (default 'GPU{gpu}:', 'CPU{rank}:' without GPUs); fields: gpu, "
            "rank, local_rank, name.",
            panel=LAUNCH_PANEL,
        ),
        "on_exit": Param(
            ("--on-exit",),
            "After the job: exit (with its code), idle (keep the container alive), stop-pod (stop this RunPod pod).",
            type=str,
            parse=choice(OnExit, "--on-exit"),
            metavar="exit|idle|stop-pod",
            panel=LAUNCH_PANEL,
        ),
        "rerun": Param(
            ("--rerun",),
            "Run again after a container restart even though the job already finished successfully.",
            type=bool,
            panel=LAUNCH_PANEL,
        ),
        "prepare": Param(
            ("--prepare",),
            "A command run once before any worker starts (cached by --cache-key; it writes to $PODGUARD_PREPARE_DIR, "
            "which workers also get).",
            panel=LAUNCH_PANEL,
        ),
        "cache_key": Param(
            ("--cache-key",),
            "KEY=VALUE that identifies the prepared data (model, dataset, context length, samples...); repeatable.",
            type=list[str] | None,
            parse=lambda values: tuple(values or ()),
            panel=LAUNCH_PANEL,
        ),
        "prepare_shared": Param(
            ("--prepare-shared",),
            "The prepare cache is on storage shared by all nodes: only node 0 prepares.",
            type=bool,
            panel=LAUNCH_PANEL,
        ),
        "job_file": Param(("--job-file",), "Roles job file (TOML).", type=Path | None, panel=LAUNCH_PANEL),
        "cpu_workers": Param(
            ("--cpu-workers",),
            "Workers to start on a node without GPUs (per-gpu and torchrun modes; the demo defaults to 2).",
            parse=count("--cpu-workers", 1),
            metavar="N",
            panel=LAUNCH_PANEL,
        ),
        "nnodes": Param(
            ("--nnodes",),
            "Nodes in a multi-node torchrun job (default NUM_NODES).",
            ("PODGUARD_NNODES", "NUM_NODES"),
            parse=count("--nnodes/NUM_NODES", 1),
            metavar="N",
            panel=LAUNCH_PANEL,
        ),
        "node_rank": Param(
            ("--node-rank",),
            "This node's rank (default NODE_RANK).",
            ("PODGUARD_NODE_RANK", "NODE_RANK"),
            parse=count("--node-rank/NODE_RANK", 0),
            metavar="N",
            panel=LAUNCH_PANEL,
        ),
        "master_addr": Param(
            ("--master-addr",),
            "Rendezvous host (default PRIMARY_ADDR / MASTER_ADDR).",
            ("PODGUARD_MASTER_ADDR", "PRIMARY_ADDR", "MASTER_ADDR"),
            parse=lambda raw: raw or None,
            panel=LAUNCH_PANEL,
        ),
        "master_port": Param(
            ("--master-port",),
            "Rendezvous port (default: a free port distinct from other podguard runs).",
            ("PODGUARD_MASTER_PORT", "PRIMARY_PORT", "MASTER_PORT"),
            parse=lambda raw: None if raw in (None, "") else values.port(raw),
            panel=LAUNCH_PANEL,
        ),
        "max_restarts": Param(
            ("--max-restarts",),
            "torchrun mode: worker group restarts before failing.",
            type=str,
            parse=whole("--max-restarts"),
            metavar="N",
            panel=LAUNCH_PANEL,
        ),
        "rdzv_backend": Param(
            ("--rdzv-backend",),
            "torchrun rendezvous: auto (static when NODE_RANK is known, so NODE_RANK=0 holds rank 0), static, "
            "c10d (elastic; ranks by arrival order).",
            type=str,
            parse=lambda raw: values.rdzv_backend(raw),
            metavar="auto|static|c10d",
            panel=LAUNCH_PANEL,
        ),
        # billing guards (guards/, docs/guards.md)
        "idle_stop": Param(
            ("--idle-stop",),
            "End the job and stop the pod once the selected GPUs all sat idle (<= 5 % utilisation) this long, "
            f"during the job or after it with --on-exit idle ({DURATION_HELP}).",
            parse=lambda raw: parse_duration(raw, "--idle-stop"),
            metavar="DURATION",
            panel=GUARDS_PANEL,
        ),
        "max_runtime": Param(
            ("--max-runtime",),
            f"End the job and stop the pod once the job has run this long ({DURATION_HELP}).",
            parse=lambda raw: parse_duration(raw, "--max-runtime"),
            metavar="DURATION",
            panel=GUARDS_PANEL,
        ),
        "max_cost": Param(
            ("--max-cost",),
            "End the job and stop the pod once its spend since its start (cost/hr from the RunPod API x uptime) "
            "reaches this many US dollars; needs RUNPOD_POD_ID and an API key. 0 or off disables.",
            parse=lambda raw: parse_usd(raw, "--max-cost"),
            metavar="USD",
            panel=GUARDS_PANEL,
        ),
        # during the run (launch/watch/, docs/watch.md)
        "hang_timeout": Param(
            ("--hang-timeout",),
            "No progress (an output line, a --progress match or a heartbeat) for this long = the job is hung: "
            "its stacks and torch's flight recorder are kept, then it is ended (exit 79, or restarted). The clock "
            f"starts at launch, so cover start-up ({DURATION_HELP}; default off).",
            parse=lambda raw: parse_duration(raw, "--hang-timeout"),
            metavar="DURATION",
            panel=RUN_PANEL,
        ),
        "progress": Param(
            ("--progress",),
            "What counts as progress: a job output line matching this regular expression (default: any line).",
            parse=lambda raw: values.regex(raw, "--progress"),
            metavar="REGEX",
            panel=RUN_PANEL,
        ),
        "restarts": Param(
            ("--restarts",),
            "After a failure (a worker's crash, a hang, a GPU fault), relaunch up to N times, each after a fresh "
            "preflight; 3 identical failures before any progress stop the restarts (default 0).",
            type=str,
            parse=whole("--restarts"),
            metavar="N",
            panel=RUN_PANEL,
        ),
        # checkpoints (checkpoints/, docs/checkpoints.md)
        "checkpoints": Param(
            ("--checkpoints",),
            "Where the job writes its checkpoints: before each attempt the newest whole one is handed to the job as "
            "PODGUARD_RESUME_FROM (and PODGUARD_RESUME_STEP); nothing there is ever changed.",
            parse=checkpoints_dir,
            metavar="DIR",
            panel=RUN_PANEL,
        ),
        "save_signal": Param(
            ("--save-signal",),
            "The signal that asks the job to save now (e.g. USR1): sent to every worker before a billing guard ends "
            "the job, then podguard waits up to --save-grace for a new whole checkpoint (needs --checkpoints).",
            parse=lambda raw: values.save_signal(raw),
            metavar="SIG",
            panel=RUN_PANEL,
        ),
        "save_grace": Param(
            ("--save-grace",),
            "How long podguard waits for that save before it ends the job (e.g. 90s, 2m, or plain seconds; > 0; "
            "default 2m).",
            type=str,
            parse=lambda raw: values.save_grace(raw),
            metavar="DURATION",
            panel=RUN_PANEL,
        ),
        "checkpoint_store": Param(
            ("--checkpoint-store",),
            "Mirror every new whole checkpoint of --checkpoints to this store, and restore from it before each "
            "attempt when it holds a newer one (a new pod): s3://BUCKET/PREFIX (AWS S3 or an S3-compatible endpoint "
            "from AWS_ENDPOINT_URL_S3: RunPod's network-volume S3 API, R2, B2, MinIO) or file:///PATH. Credentials: "
            "the standard AWS variables or files.",
            parse=lambda raw: parse_store_url(raw),
            metavar="URL",
            panel=RUN_PANEL,
        ),
        "store_keep": Param(
            ("--store-keep",),
            "How many whole checkpoints the store keeps (>= 1, default 2); older ones go only after a newer one "
            "is whole there.",
            type=str,
            parse=whole("--store-keep", 1),
            metavar="N",
            panel=RUN_PANEL,
        ),
        "cluster_timeout_s": Param(
            ("--cluster-timeout",),
            "Multi-node: seconds every node waits for all nodes' preflight verdicts (the cluster gate) before "
            "giving up (exit 75, naming the nodes that did not report).",
            ("PODGUARD_CLUSTER_TIMEOUT",),
            type=str,
            parse=lambda raw: values.positive_seconds(raw, "--cluster-timeout"),
            metavar="SECONDS",
            panel=LAUNCH_PANEL,
        ),
        "cluster_port": Param(
            ("--cluster-port",),
            "Multi-node: the cluster gate's TCP port on node 0 (default PRIMARY_PORT + 1; the same on every node).",
            ("PODGUARD_CLUSTER_PORT",),
            parse=lambda raw: None if raw in (None, "") else parse_int(raw, "PODGUARD_CLUSTER_PORT", 1, 65535),
            metavar="PORT",
            panel=LAUNCH_PANEL,
        ),
        # metrics (metrics/, docs/metrics.md)
        "metrics_port": Param(
            ("--metrics-port",),
            "Serve Prometheus metrics (GPUs, ranks, restarts, spend) at http://0.0.0.0:PORT/metrics for the life of "
            "the run (e.g. 9464; default off). A taken port is exit 64 before the job starts.",
            ("PODGUARD_METRICS_PORT",),
            parse=lambda raw: None if raw in (None, "") else parse_int(raw, "--metrics-port", 1, 65535),
            metavar="PORT",
            panel=RUN_PANEL,
        ),
        "metrics_file": Param(
            ("--metrics-file",),
            "Write the same metrics to PATH every 15 s, atomically (node_exporter's textfile collector: *.prom).",
            ("PODGUARD_METRICS_FILE",),
            parse=lambda raw: None if raw is None else values.metrics_file(raw),
            metavar="PATH",
            panel=RUN_PANEL,
        ),
    },
)
