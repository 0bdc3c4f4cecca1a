#!/usr/bin/env bash
# The run-time watch on a real GPU machine (issue 19): a real NCCL job made to hang under `podguard train
# --hang-timeout`, the evidence podguard kept (stacks, the flight-recorder dump), and the GPU fault watch's cost
# on the real driver.
#
#   bench/device_watch.sh               # from anywhere; runs from the repository root
#
# Needs: an NVIDIA GPU, python3 with torch (CUDA); typer and nvidia-ml-py; py-spy (installed offline from .whl/
# when missing). Writes a private state dir; copies the evidence to $OUT (a tarball) when set. Under 2 minutes.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=$(mktemp -d /tmp/podguard-device-watch.XXXXXX)
export PYTHONPATH="$PWD/entrypoint${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export PODGUARD_STATE_DIR="$RESULTS/state"
unset GPU_LIST PODGUARD_PROBE_CMD NPROC_PER_NODE RUNPOD_GPU_COUNT
if ! command -v py-spy >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --target "$RESULTS/site" .whl/py_spy-*.whl && export PATH="$RESULTS/site/bin:$PATH"
fi
py-spy --version
echo "== a real NCCL job that hangs: podguard train --hang-timeout 25 (per-gpu, one rank per GPU)"
start=$(date +%s%N)
timeout 150 "$PY" -m podguard train --probe off --mode per-gpu --hang-timeout 25 --grace 5 -- "$PY" bench/device_hang_job.py \
  >"$RESULTS/train.out" 2>"$RESULTS/train.err"
rc=$?
end=$(date +%s%N)
printf 'exit %d, wall %d.%03d s\n' "$rc" $(((end - start) / 1000000000)) $((((end - start) / 1000000) % 1000))
cat "$RESULTS/train.out" "$RESULTS/train.err" | grep -v "^  report:" | tail -25
echo "== the evidence"
find "$PODGUARD_STATE_DIR/runs" -path '*hang*' -type f -o -path '*hang*' -type p | sed "s|$PODGUARD_STATE_DIR/||"
hang=$(ls "$PODGUARD_STATE_DIR"/runs/*/hang/hang.json 2>/dev/null | head -1)
[ -n "$hang" ] && "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({k: r[k] for k in ("hang","stacks","flight_recorder","summary") if k in r}, indent=1))' "$hang"
for dump in "$PODGUARD_STATE_DIR"/runs/*/hang/flight/nccl_trace_rank_*; do
  [ -f "$dump" ] || continue
  "$PY" - "$dump" <<'PYEOF'
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
entries = d.get("entries", [])
print(f"flight dump {sys.argv[1].rsplit('/', 1)[1]}: version {d.get('version')}, {len(entries)} entries:",
      [(e.get("profiling_name"), e.get("state")) for e in entries][:8])
PYEOF
done
head -40 "$PODGUARD_STATE_DIR"/runs/*/hang/stacks/rank0.txt 2>/dev/null
echo "== GPU fault watch on the real driver"
"$PY" bench/bench_gpu_watch.py --real --polls 2000 2>&1 | tail -12
echo "== heartbeat and supervisor figures are CPU-side: bench/bench_watch.py on CPU"
if [ -n "${OUT:-}" ]; then tar czf "$OUT/watch-evidence.tgz" -C "$RESULTS" . 2>/dev/null; fi
