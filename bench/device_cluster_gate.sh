#!/usr/bin/env bash
# The cluster gate on a real GPU machine: two `podguard train` processes on this host as the two nodes of
# one cluster, over loopback, sharing the machine's GPU(s). Run from the repository root:
#
#     PYTHONPATH=entrypoint bash bench/device_cluster_gate.sh          # python3 must have torch (CUDA build)
#
# Two scenarios, each printing both nodes' output (preflight summary, gate summary, the job's lines):
#   A. both nodes healthy: node 0 starts, node 1 joins a moment later; both launch; each rank prints
#      `RANK cuda-available`; the gate latency (node 1's verdict -> both nodes launching) from the records.
#   B. node 1's probe fails (PODGUARD_PROBE_CMD=false): both nodes exit 76 without starting a worker, and
#      node 0's gate summary names node 1 and its reason.
#
# Two nodes on one host are not two machines, so the script keeps them apart the way machines would be:
# - a state dir per node (PODGUARD_STATE_DIR): GPU leases live there, so each node leases "its" GPU 0
#   (with one state dir, node 1 would find GPU 0 leased by node 0 and refuse with 75);
# - --no-cleanup on both: a node would otherwise take the other node's processes on the shared GPU (its
#   CUDA probe, its workers) for leftovers and stop them; without cleanup it waits for a busy GPU instead;
# - node 1 starts after node 0's preflight summary, so the two CUDA probes do not overlap on one GPU.
# Needs no internet. Takes well under a minute (each phase has its own timeout).
# Without a GPU (a dry run of the script itself): PODGUARD_PROBE=off NODE_GPU_LIST= NODE_GPU_COUNT= .
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-entrypoint}"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d /tmp/podguard-cgate.XXXXXX)"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT

"$PY" -c 'import torch, podguard; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' || {
    echo "python3 needs torch and podguard (PYTHONPATH=entrypoint)"; exit 2; }
nvidia-smi --query-gpu=index,name,memory.used,compute_mode --format=csv,noheader 2>/dev/null || true

free_port() {  # a port whose successor is free too (the gate listens on PRIMARY_PORT + 1)
    "$PY" - <<'EOF'
import socket
for _ in range(100):
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0)); port = a.getsockname()[1]
        try:
            b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        print(port); break
EOF
}

JOB='import os, torch; print(os.environ.get("RANK"), torch.cuda.is_available(), os.environ.get("NCCL_SOCKET_IFNAME"), flush=True)'

start_node() {  # start_node SCENARIO RANK PORT [VAR=VALUE ...]: one node in the background, output in a file
    local scenario=$1 rank=$2 port=$3; shift 3
    mkdir -p "$WORK/$scenario"
    env -u GPU_LIST -u CUDA_VISIBLE_DEVICES -u NCCL_SOCKET_IFNAME -u GLOO_SOCKET_IFNAME \
        PODGUARD_STATE_DIR="$WORK/$scenario/node$rank" PODGUARD_PROBE="${PODGUARD_PROBE:-cuda}" \
        NUM_NODES=2 NODE_RANK="$rank" NUM_TRAINERS=1 WORLD_SIZE=2 RUNPOD_GPU_COUNT="${NODE_GPU_COUNT-1}" \
        PRIMARY_ADDR=127.0.0.1 PRIMARY_PORT="$port" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
        HOST_NODE_ADDR="127.0.0.1:$port" NODE_ADDR=127.0.0.1 GPU_LIST="${NODE_GPU_LIST-0}" "$@" \
        timeout 50 "$PY" -m podguard train --mode torchrun --no-cleanup --busy-timeout 20 --cluster-timeout 40 \
        --grace 3 -- "$PY" -c "$JOB" >"$WORK/$scenario/node$rank.log" 2>&1 &
    PIDS+=($!)
    echo $! >"$WORK/$scenario/node$rank.pid"
}

wait_for_line() {  # wait_for_line FILE PATTERN SECONDS: poll until the line appears (or give up)
    local deadline=$((SECONDS + $3))
    until grep -q "$2" "$1" 2>/dev/null; do
        [ $SECONDS -ge $deadline ] && return 1
        sleep 0.1
    done
}

run_scenario() {  # run_scenario NAME [node 1's VAR=VALUE ...]
    local name=$1; shift
    local port; port=$(free_port)
    local t0=$SECONDS
    start_node "$name" 0 "$port"
    wait_for_line "$WORK/$name/node0.log" "^podguard train: " 30 || echo "(node 0 printed no preflight line in 30 s)"
    start_node "$name" 1 "$port" "$@"
    local rc0 rc1
    wait "$(cat "$WORK/$name/node0.pid")"; rc0=$?
    wait "$(cat "$WORK/$name/node1.pid")"; rc1=$?
    PIDS=()
    echo
    echo "==================== scenario $name: node 0 exit $rc0, node 1 exit $rc1 ($((SECONDS - t0)) s)"
    for rank in 0 1; do
        echo "---------- node $rank"
        sed "s/^/node$rank| /" "$WORK/$name/node$rank.log"
    done
    "$PY" - "$WORK/$name" <<'EOF'
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
records = []
for rank in (0, 1):
    path = root / f"node{rank}" / "reports" / "cluster-gate.json"
    if path.exists():
        records.append(json.loads(path.read_text()))
    else:
        print(f"gate record of node {rank}: missing ({path})")
if len(records) == 2 and all(r.get("published_at") for r in records):
    last_verdict = max(r["published_at"] for r in records)
    latency = max(r["returned_at"] for r in records) - last_verdict
    print(f"gate latency: last verdict -> both nodes' gate returned: {latency * 1000:.1f} ms (target < 1000 ms)")
    for r in records:
        print(f"  node {r['node_rank']}: code {r['code']}, waited {r['waited_s']:.2f} s after its own verdict")
else:
    print("gate latency: n/a (a node did not publish: it followed a decision made before it reported)")
EOF
}

run_scenario A
run_scenario B PODGUARD_PROBE_CMD=false
echo
echo "logs and records: $WORK"
