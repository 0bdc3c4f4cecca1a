#!/usr/bin/env bash
# `--progress` and heartbeats in torchrun mode on a real GPU (issue 19 review): a real NCCL job whose every line
# reaches podguard through torchrun with the rank wrapper's `rankN:` prefix. With `--progress '^step \d+'` and a
# hang timeout shorter than the job, it must end 0 with no HUNG line (before the fix: 79 at the timeout, as no
# prefixed line matched). Then the gate on the same GPU (`health --probe cuda`) after the h2d/NVLink rule changes.
#
#   bench/device_progress.sh            # from anywhere; runs from the repository root; about a minute
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=${OUT:-$(mktemp -d /tmp/podguard-device-progress.XXXXXX)}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD/entrypoint${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export PODGUARD_STATE_DIR="$RESULTS/state"
unset GPU_LIST PODGUARD_PROBE_CMD NPROC_PER_NODE RUNPOD_GPU_COUNT
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
echo "== torchrun, --progress '^step \\d+', --hang-timeout 15: a 20 s job of prefixed step lines"
start=$(date +%s%N)
STEPS=40 timeout 120 "$PY" -m podguard train --probe off --mode torchrun --hang-timeout 15 --progress '^step \d+' \
  --grace 5 -- "$PY" bench/device_progress_job.py >"$RESULTS/progress.out" 2>"$RESULTS/progress.err"
rc=$?
end=$(date +%s%N)
printf 'exit %d, wall %d.%03d s, HUNG lines: %d\n' "$rc" $(((end - start) / 1000000000)) \
  $((((end - start) / 1000000) % 1000)) "$(grep -c HUNG "$RESULTS/progress.out" "$RESULTS/progress.err" | awk -F: '{s+=$2} END {print s}')"
grep -E "^rank0:(step (0|39)|rank)" "$RESULTS/progress.out" | head -3
grep -E "END|HUNG" "$RESULTS/progress.out" "$RESULTS/progress.err" | sed 's|^.*/||' | tail -3
"$PY" -c 'import json,glob; w=json.load(open(sorted(glob.glob("'"$PODGUARD_STATE_DIR"'/runs/*/watch.json"))[-1])); print("watch.json:", {k: w[k] for k in ("hang","progressed","stragglers")})'
"$PY" -c 'import glob; from podguard.rank.progress import read_board; print("heartbeat board:", read_board(__import__("pathlib").Path(sorted(glob.glob("'"$PODGUARD_STATE_DIR"'/runs/*/heartbeats"))[-1])))'
echo "== the gate on this GPU: podguard health --probe cuda"
start=$(date +%s%N)
timeout 90 "$PY" -m podguard health --probe cuda >"$RESULTS/health.out" 2>"$RESULTS/health.err"
rc=$?
end=$(date +%s%N)
printf 'exit %d, wall %d.%03d s\n' "$rc" $(((end - start) / 1000000000)) $((((end - start) / 1000000) % 1000))
grep -v "^  report:" "$RESULTS/health.err" | head -6
