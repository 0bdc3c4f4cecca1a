#!/usr/bin/env bash
# The gate on a real GPU machine: the measured probe, the full probe (node all-reduce) and doctor, each timed.
#
#   bench/device_gate.sh                 # from anywhere; runs from the repository root
#   PYTHON=/opt/venv/bin/python WHEELS=/path/to/wheels bench/device_gate.sh
#
# Needs: an NVIDIA GPU, python3 with torch (CUDA build); podguard is used from this checkout
# (PYTHONPATH=entrypoint). typer and nvidia-ml-py come from that Python, else they are installed offline
# from $WHEELS (default .whl/) into build/device-site. No internet. Writes a private state dir; prints the
# GPU model, each command's wall time and exit code, and the metrics; copies everything to $OUT when set.
# Budget: well under 2 minutes on one GPU (each command is capped at 90 s).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
RESULTS=${OUT:-$(mktemp -d /tmp/podguard-device-gate.XXXXXX)}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD/entrypoint${PYTHONPATH:+:$PYTHONPATH}"
export PODGUARD_STATE_DIR="$RESULTS/state"
unset GPU_LIST PODGUARD_PROBE PODGUARD_PROBE_CMD NPROC_PER_NODE RUNPOD_GPU_COUNT

if ! "$PY" -c 'import typer, pynvml' 2>/dev/null; then
  echo "typer/nvidia-ml-py not importable: installing from $WHEELS (offline) into build/device-site"
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" --target build/device-site typer nvidia-ml-py || exit 1
  export PYTHONPATH="$PYTHONPATH:$PWD/build/device-site"
fi

echo "== machine"
nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.max,pcie.link.width.max,power.limit \
  --format=csv,noheader 2>&1 | tee "$RESULTS/nvidia-smi.txt"
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' \
  2>/dev/null | tee "$RESULTS/versions.txt"

# timed NAME CMD...: run CMD (stdout -> NAME.out, stderr -> NAME.err), print its wall time and exit code
timed() {
  local name=$1
  shift
  local start end rc
  start=$(date +%s%N)
  timeout 90 "$@" >"$RESULTS/$name.out" 2>"$RESULTS/$name.err"
  rc=$?
  end=$(date +%s%N)
  printf '\n== %s: exit %d, wall %d.%03d s\n' "$*" "$rc" $(((end - start) / 1000000000)) $((((end - start) / 1000000) % 1000))
  head -n 1 "$RESULTS/$name.err"
}

# metrics NAME: the per-GPU metrics, findings and the all-reduce from a `health --json` output
metrics() {
  "$PY" - "$RESULTS/$1.out" <<'EOF'
import json, sys
try:
    report = json.load(open(sys.argv[1]))["report"]
except (OSError, ValueError, KeyError) as exc:
    sys.exit(f"   no JSON report ({exc})")
for gpu in report.get("gpus", []):
    print(f"   GPU{gpu['index']} {gpu.get('name', '')}: {gpu.get('verdict')} metrics={gpu.get('metrics')}")
    for finding in gpu.get("degraded") or []:
        print(f"      degraded: {finding['text']}")
for verdict in report.get("gate", {}).get("verdicts", []):
    probe = verdict.get("probe") or {}
    if probe:
        print(f"   GPU{verdict['index']} probe: ok={probe.get('ok')} {probe.get('duration_ms')} ms {probe.get('reason') or ''}")
print(f"   all-reduce: {report.get('gate', {}).get('allreduce')}")
EOF
}

timed health-cuda "$PY" -m podguard health --probe cuda --json
metrics health-cuda

timed health-full env PODGUARD_PROBE=full "$PY" -m podguard health --json
metrics health-full

timed doctor "$PY" -m podguard doctor
cat "$RESULTS/doctor.out"

# NCCL itself: a 1-rank all-reduce (one GPU has no interconnect to measure, but the code path runs)
timed nccl-1rank "$PY" -m podguard.preflight.gate.probe.allreduce_child --rank 0 --world 1 \
  --store "$RESULTS/nccl-store" --backend nccl --bytes 1073741824
tail -n 1 "$RESULTS/nccl-1rank.out"

echo
echo "outputs: $RESULTS"
