"""What NVML really says on a GPU machine, for the gate's rules (docs/gate.md, "Measured on real hardware").

    python3 bench/device_nvml_facts.py [--samples 400] [--json OUT]

Prints, per GPU: the PCIe link (current and maximum generation and width, the GPU's own maximum generation), the
NVLink link count and states, the clock event reasons at idle; then samples the reasons every millisecond or so
while a child process loads the GPU and after it exits (the P-state change nvml.h says may set HW slowdown for an
instant), counting each bit seen; and times the NVML calls the run-time GPU watch would make (event wait with a
zero timeout, the recovery-action field). Needs an NVIDIA GPU and nvidia-ml-py; the load needs torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections import Counter

import pynvml as n

BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
LOAD = (
    "import torch,time;a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16);t=time.time()\n"
    "while time.time()-t<{s}: a@a\ntorch.cuda.synchronize()"
)


def call(fn, *args):
    try:
        return fn(*args)
    except n.NVMLError as exc:
        return f"error: {exc}"


def names(mask: int) -> list[str]:
    return [name for bit, name in BITS.items() if mask & bit]


def timed(fn, *args, repeats: int = 200) -> float:
    t = time.perf_counter()
    for _ in range(repeats):
        with contextlib.suppress(n.NVMLError):
            fn(*args)
    return (time.perf_counter() - t) / repeats * 1e6


def sample_reasons(h, seconds: float) -> tuple[Counter, int, list[tuple[float, int, int]]]:
    seen: Counter = Counter()
    changes: list[tuple[float, int, int]] = []
    last, count, t0 = None, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        mask = n.nvmlDeviceGetCurrentClocksEventReasons(h)
        util = n.nvmlDeviceGetUtilizationRates(h).gpu
        count += 1
        for name in names(mask):
            seen[name] += 1
        if mask != last:
            changes.append((round(time.perf_counter() - t0, 4), mask, util))
            last = mask
        time.sleep(0.001)
    return seen, count, changes[:40]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--load-s", type=float, default=3.0)
    ap.add_argument("--after-s", type=float, default=4.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    n.nvmlInit()
    out: dict = {"driver": n.nvmlSystemGetDriverVersion(), "nvml": n.nvmlSystemGetNVMLVersion(), "gpus": []}
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        gpu = {
            "index": i,
            "name": n.nvmlDeviceGetName(h),
            "pcie_gen": call(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_gen_max": call(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "pcie_gen_gpu_max": call(n.nvmlDeviceGetGpuMaxPcieLinkGeneration, h),
            "pcie_width": call(n.nvmlDeviceGetCurrPcieLinkWidth, h),
            "pcie_width_max": call(n.nvmlDeviceGetMaxPcieLinkWidth, h),
            "clock_reasons_idle": names(call(n.nvmlDeviceGetCurrentClocksEventReasons, h) or 0),
            "temperature": call(n.nvmlDeviceGetTemperature, h, 0),
            "slowdown_temp": call(n.nvmlDeviceGetTemperatureThreshold, h, 1),
            "supported_events": hex(call(n.nvmlDeviceGetSupportedEventTypes, h) or 0),
        }
        fv = call(n.nvmlDeviceGetFieldValues, h, [n.NVML_FI_DEV_NVLINK_LINK_COUNT])
        gpu["nvlink_link_count"] = fv if isinstance(fv, str) else [(int(v.nvmlReturn), v.value.uiVal) for v in fv]
        gpu["nvlink_state_link0"] = call(n.nvmlDeviceGetNvLinkState, h, 0)
        gpu["us_per_call"] = {
            "clock_reasons": round(timed(n.nvmlDeviceGetCurrentClocksEventReasons, h), 2),
            "utilization": round(timed(n.nvmlDeviceGetUtilizationRates, h), 2),
            "memory_info": round(timed(n.nvmlDeviceGetMemoryInfo, h), 2),
        }
        try:
            es = n.nvmlEventSetCreate()
            n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
            gpu["us_per_call"]["event_wait_0ms"] = round(timed(n.nvmlEventSetWait_v2, es, 0), 2)
            n.nvmlEventSetFree(es)
        except n.NVMLError as exc:
            gpu["xid_events"] = f"error: {exc}"
        load = subprocess.Popen([sys.executable, "-c", LOAD.format(s=args.load_s)])
        seen_load, count_load, _ = sample_reasons(h, args.load_s + 2.0)
        load.wait()
        seen_after, count_after, changes = sample_reasons(h, args.after_s)
        gpu["reasons_under_load"] = {"samples": count_load, "seen": dict(seen_load)}
        gpu["reasons_after_load"] = {"samples": count_after, "seen": dict(seen_after), "changes": changes}
        out["gpus"].append(gpu)
    n.nvmlShutdown()
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
