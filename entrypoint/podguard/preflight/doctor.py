"""`podguard doctor`: the diagnostics a person reads when something is wrong; read-only, it only recommends.

    data = collect(PreflightOptions(command="doctor"))   # driver, GPUs, holders, health, env, host, last report
    print(render(data))                                  # or json.dumps(data) for `--json`

NVML only (never a CUDA context); secrets are reported as present/absent, other values pass through
podguard.redact.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from podguard import __version__
from podguard.gpu.backend import GpuSnapshot, NvmlUnavailable
from podguard.gpu.factory import open_backend
from podguard.pods import thispod
from podguard.preflight.cleanup.describe import describe_holders
from podguard.preflight.doctor_table import gpu_table
from podguard.preflight.gate.degraded import Degraded
from podguard.preflight.gate.rules import GateThresholds, judge_all, scope_to_mig
from podguard.preflight.gate.stage import confirmed_degraded
from podguard.preflight.options import PreflightOptions
from podguard.preflight.report import na
from podguard.records import to_data
from podguard.redact import redact_env
from podguard.state import state_dir
from podguard.units import GIB, MIB

__all__ = ["collect", "recommend", "render"]

DISTRIBUTED_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "NNODES",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "GPU_LIST",
    "NPROC_PER_NODE",
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)
RUNPOD_VARS = (
    thispod.ENV_POD_ID,
    "RUNPOD_POD_HOSTNAME",
    "RUNPOD_GPU_COUNT",
    "RUNPOD_CPU_COUNT",
    "RUNPOD_DC_ID",
    "RUNPOD_PUBLIC_IP",
    "RUNPOD_TCP_PORT_22",
    "RUNPOD_API_BASE_URL",
    "PRIMARY_ADDR",
    "PRIMARY_PORT",
    "NODE_RANK",
    "NUM_NODES",
    "NUM_TRAINERS",
)
SECRET_VARS = ("RUNPOD_API_KEY", "PUBLIC_KEY", "HF_TOKEN", "WANDB_API_KEY")
SHM_MINIMUM = 1 * GIB  # Docker's default 64 MiB /dev/shm breaks NCCL and DataLoader workers
METRIC_REPORTS = 20  # how many recent reports to look through for the last measured probe metrics


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _disk(path: Path) -> dict[str, Any] | None:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return {"path": str(path), "total": usage.total, "free": usage.free}


def _host() -> dict[str, Any]:
    mem = _meminfo()
    return {
        "cpus": os.cpu_count(),
        "memory_total": mem.get("MemTotal"),
        "memory_available": mem.get("MemAvailable"),
        "shm": _disk(Path("/dev/shm")),
        "workspace": _disk(Path("/workspace")) if Path("/workspace").exists() else None,
        "pid1": _comm(1),
        "in_container": Path("/.dockerenv").exists() or Path("/run/.containerenv").exists(),
        "torch_installed": importlib.util.find_spec("torch") is not None,
    }


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _holders(backend: Any, snaps: list[GpuSnapshot], dev_dir: Path) -> dict[str, Any]:
    """Who holds each GPU, with the same evidence rules the cleanup uses (read-only here)."""
    try:
        return describe_holders(
            backend, [s.index for s in snaps], dev_dir=dev_dir, snapshots={s.index: s for s in snaps}
        )
    except Exception as exc:  # doctor must always print what it has
        return {"error": f"could not inspect processes: {exc}"}


def _latest_report(base: Path) -> dict[str, Any] | None:
    path = base / "reports" / "latest.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {
        "path": str(path),
        "command": data.get("command"),
        "started_at": data.get("started_at"),
        "verdict": data.get("verdict"),
        "exit_code": data.get("exit_code"),
        "message": data.get("message"),
    }


def _last_metrics(base: Path, snaps: list[GpuSnapshot]) -> dict[str, Any]:
    """Probe metrics of the newest recent report that has any, per GPU index (matched by UUID: a report from
    before a pod moved machines says nothing about these GPUs)."""
    uuids = {s.uuid: s.index for s in snaps if s.uuid}
    try:
        paths = sorted((base / "reports").glob("[0-9]*.json"), reverse=True)[:METRIC_REPORTS]
    except OSError:
        return {}
    for path in paths:
        try:
            gpus = json.loads(path.read_text()).get("gpus") or []
        except (OSError, ValueError, AttributeError):
            continue
        found = {str(uuids[g["uuid"]]): g["metrics"] for g in gpus if g.get("metrics") and g.get("uuid") in uuids}
        if found:
            return {"report": str(path), "gpus": found}
    return {}


def collect(opts: PreflightOptions) -> dict[str, Any]:
    """Gather everything; every section degrades to an explanation instead of failing."""
    data: dict[str, Any] = {"podguard_version": __version__}
    snaps: list[GpuSnapshot] = []
    found: dict[int, tuple[Degraded, ...]] = {}
    backend = None
    try:
        backend = open_backend()
    except NvmlUnavailable as exc:
        data["nvml"] = {"available": False, "failure": exc.kind.value, "message": exc.message}
    if backend is None and "nvml" not in data:
        data["nvml"] = {"available": False, "failure": "library_not_found", "message": "no NVIDIA driver: CPU only"}
    if backend is not None:
        try:
            drv = backend.driver()
            data["nvml"] = {"available": True, **to_data(drv)}
            snaps = [backend.snapshot(i) for i in range(backend.device_count())]
            read_at = time.monotonic()
            data["holders"] = _holders(backend, snaps, opts.dev_dir)
            indices = [s.index for s in snaps]
            found = confirmed_degraded(backend, indices, {}, [[scope_to_mig(s) for s in snaps]], read_at)
        finally:
            backend.close()
    data["gpus"] = [s.to_dict() for s in snaps]
    thresholds = GateThresholds(opts.idle_memory_mib, opts.max_temperature_margin_c, degraded_policy=opts.degraded)
    gate = judge_all([scope_to_mig(s) for s in snaps], thresholds, nvml_degraded=found)
    data["health"] = [v.to_dict() for v in gate.verdicts]
    env = os.environ
    data["distributed_env"] = redact_env({k: env[k] for k in DISTRIBUTED_VARS if k in env})
    data["runpod_env"] = redact_env({k: env[k] for k in RUNPOD_VARS if k in env})
    data["secrets"] = {k: ("present" if env.get(k) else "absent") for k in SECRET_VARS}
    data["host"] = _host()
    try:
        base = state_dir(opts.state_dir)
        data["state_dir"] = str(base)
        data["last_preflight"] = _latest_report(base)
        data["metrics"] = _last_metrics(base, snaps)
    except Exception as exc:
        data["state_dir"] = f"unusable: {exc}"
        data["metrics"] = {}
    data["recommendations"] = recommend(data, snaps)
    return data


def recommend(data: dict[str, Any], snaps: list[GpuSnapshot]) -> list[str]:
    recs: list[str] = []
    nvml = data.get("nvml", {})
    if not nvml.get("available"):
        failure = nvml.get("failure")
        if failure == "library_not_found":
            recs.append(
                "no NVIDIA driver visible: on a GPU host start the container with `--gpus all`; "
                "on a CPU pod podguard trains on CPU"
            )
        else:
            recs.append(f"{nvml.get('message')}")
    for verdict in data.get("health", []):
        if verdict["verdict"] == "unhealthy":
            recs.append(
                f"GPU{verdict['index']} is unhealthy ({'; '.join(verdict['reasons'])}): exclude it with GPU_LIST, "
                "or stop and start the pod / move machines"
            )
        elif verdict["verdict"] == "unknown":
            recs.append(
                f"GPU{verdict['index']}: {'; '.join(verdict['reasons'])}: run podguard where NVML may read process "
                "lists and memory (privileged, or select MIG devices), or check the driver"
            )
        elif verdict["verdict"] == "excluded":
            recs.append(
                f"GPU{verdict['index']} is degraded ({'; '.join(verdict['reasons'])}): --degraded exclude leaves it "
                "out; stop and start the pod or move machines to get all GPUs at full speed"
            )
        elif verdict["verdict"] == "busy":
            recs.append(f"GPU{verdict['index']} is busy ({'; '.join(verdict['reasons'])}): run `podguard cleanup`")
    if any(s.compute_mode is not None and s.compute_mode.value == "exclusive_process" for s in snaps):
        recs.append("a GPU is in exclusive-process compute mode: only one process may hold a context on it")
    if snaps and any(s.persistence_mode is False for s in snaps):
        recs.append("persistence mode is off: the first CUDA call after idle is slower (host setting)")
    env = data.get("distributed_env", {})
    world, local_rank = env.get("WORLD_SIZE"), env.get("LOCAL_RANK")
    if local_rank is not None and local_rank.isdigit() and snaps and int(local_rank) >= len(snaps):
        recs.append(f"LOCAL_RANK={local_rank} but only {len(snaps)} GPU(s): this is the 'invalid device ordinal' crash")
    if world is not None and not world.isdigit():
        recs.append(f"WORLD_SIZE={world!r} is not a number")
    expected = data.get("runpod_env", {}).get("RUNPOD_GPU_COUNT")
    if expected and expected.isdigit() and nvml.get("available") and int(expected) != len(snaps):
        recs.append(f"RUNPOD_GPU_COUNT={expected} but NVML sees {len(snaps)} GPU(s): a GPU may have fallen off")
    shm = (data.get("host") or {}).get("shm")
    if shm and shm["total"] < SHM_MINIMUM and len(snaps) > 1:
        recs.append(
            f"/dev/shm is only {shm['total'] // MIB} MiB: NCCL and DataLoader workers need more "
            "(docker run --shm-size=16g, or --ipc=host)"
        )
    host = data.get("host") or {}
    if host.get("in_container") and host.get("pid1") not in (None, "tini", "dumb-init", "docker-init", "podguard"):
        recs.append(
            f"PID 1 is {host.get('pid1')!r}: zombies of crashed workers may pile up; run podguard (or tini) as PID 1"
        )
    if not recs:
        recs.append("nothing wrong found")
    return recs


def _render_gpu(gpu: dict[str, Any], verdict: dict[str, Any], holders: dict[str, Any]) -> list[str]:
    """The lines of one GPU: identity and verdict, state, who holds it, reasons and warnings."""
    out: list[str] = []
    idx = gpu["index"]
    total, used = gpu.get("memory_total"), gpu.get("memory_used")
    mem = "n/a" if total is None else f"{(used or 0) // MIB}/{total // MIB} MiB"
    ecc = gpu.get("ecc") or {}
    label = verdict.get("verdict", "?")
    out.append(f"GPU{idx} {na(gpu.get('name'))} {na(gpu.get('uuid'))} [{label}]")
    out.append(
        f"    pci {na(gpu.get('pci_bus_id'))}  mem {mem}  util {na(gpu.get('utilization_gpu'), '%')}  "
        f"temp {na(gpu.get('temperature_c'), 'C')}/{na(gpu.get('temperature_slowdown_c'), 'C')}  "
        f"pcie x{na(gpu.get('pcie_link_width'))}/x{na(gpu.get('pcie_link_width_max'))}"
    )
    out.append(
        f"    compute {na(gpu.get('compute_mode'))}  persistence {na(gpu.get('persistence_mode'))}  "
        f"MIG {na(gpu.get('mig_enabled'))}  ECC {na(ecc.get('enabled'))} "
        f"(uncorrected {na(ecc.get('uncorrected_volatile'))}, corrected {na(ecc.get('corrected_volatile'))})  "
        f"remap pending {na(ecc.get('remap_pending'))} failed {na(ecc.get('remap_failure'))}  "
        f"retired pending {na(ecc.get('retired_pages_pending'))}"
    )
    if gpu.get("clock_event_names"):
        out.append(f"    clocks limited by: {', '.join(gpu['clock_event_names'])}")
    for proc in holders.get(str(idx), holders.get(idx, [])):
        out.append(f"    held by {proc}")
    for reason in verdict.get("reasons", []):
        out.append(f"    ! {reason}")
    for warning in verdict.get("warnings", []):
        out.append(f"    ~ {warning}")
    return out


def render(data: dict[str, Any]) -> str:
    out: list[str] = [f"podguard doctor {data['podguard_version']}"]
    nvml = data.get("nvml", {})
    if nvml.get("available"):
        out.append(
            f"driver {na(nvml.get('driver_version'))}, CUDA driver {na(nvml.get('cuda_driver_version'))}, "
            f"NVML {na(nvml.get('nvml_version'))}"
        )
    else:
        out.append(f"NVML unavailable ({nvml.get('failure')}): {nvml.get('message')}")
    health = {h["index"]: h for h in data.get("health", [])}
    holders = (data.get("holders") or {}).get("gpus", {})
    if data.get("gpus"):
        measured = data.get("metrics") or {}
        out.extend(gpu_table(data["gpus"], data.get("health", []), measured.get("gpus") or {}))
        out.append(f"metrics: {measured['report']}" if measured else "metrics: none measured yet (PODGUARD_PROBE=cuda)")
    for gpu in data.get("gpus", []):
        out.extend(_render_gpu(gpu, health.get(gpu["index"], {}), holders))
    if (data.get("holders") or {}).get("foreign"):
        out.append(f"NVML reports processes that are not in this container: {data['holders']['foreign']}")
    out.append("distributed env: " + (", ".join(f"{k}={v}" for k, v in data["distributed_env"].items()) or "none"))
    out.append("RunPod env: " + (", ".join(f"{k}={v}" for k, v in data["runpod_env"].items()) or "none"))
    out.append("secrets: " + ", ".join(f"{k} {v}" for k, v in data["secrets"].items()))
    host = data.get("host", {})
    shm = host.get("shm") or {}
    out.append(
        f"host: {host.get('cpus')} CPUs, {(host.get('memory_available') or 0) // GIB}/"
        f"{(host.get('memory_total') or 0) // GIB} GiB free, /dev/shm {(shm.get('total') or 0) // MIB} MiB, "
        f"PID 1 {host.get('pid1')}, torch {'installed' if host.get('torch_installed') else 'not installed'}"
    )
    out.append(f"state dir: {data.get('state_dir')}")
    last = data.get("last_preflight")
    if last:
        out.append(
            f"last preflight: {last['command']} at {last['started_at']}: {last['verdict']} "
            f"(exit {last['exit_code']}) {last.get('message') or ''}".rstrip()
        )
    out.append("recommendations:")
    out.extend(f"  - {r}" for r in data["recommendations"])
    return "\n".join(out)
