#!/usr/bin/env bash
# Run a command with CPU hogs beside it (a busy machine: a user's laptop, a shared CI runner), the hogs always
# killed afterwards (exit, error or Ctrl-C), and each hog ends itself once this script is gone however it went
# (SIGKILL included: it watches its parent). HOGS (default 2) busy loops, one process each. Exit: the command's.
#
#   tests/with_cpu_hogs.sh .venv/bin/python -m pytest -q -m timing
#   HOGS=4 tests/with_cpu_hogs.sh .venv/bin/python -m pytest -q tests/launch
set -u
hogs=()
stop_hogs() {
  local pid
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
  hogs=()
}
trap stop_hogs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
py="${PYTHON:-python3}"
for _ in $(seq 1 "${HOGS:-2}"); do
  "$py" -c '
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
' &
  hogs+=("$!")
done
echo "with_cpu_hogs: ${#hogs[@]} CPU hog(s) beside the command (pids ${hogs[*]})" >&2
"$@"
