"""Scenario files for the fake NVML: what the fake GPU node looks like.

Why a file: the fake library is C code loaded into the process under test (and into its children), so
the simplest shared configuration channel is a small line-based `key=value` file named by the env var
`FAKE_NVML_SCENARIO`. The fake re-reads it on every `nvmlInit*` and whenever the file changes, so a test
can change the node while a process runs (`Scenario.write` replaces it atomically).

File format (one `key=value` per line, `#` comments)::

    version=1
    init_error=LIB_RM_VERSION_MISMATCH     # NVML error name (without NVML_ERROR_), returned by nvmlInit*
    driver_version=550.54.15
    nvml_version=12.550.54.15
    cuda_version=12040                     # as nvmlSystemGetCudaDriverVersion returns it
    release_delay_ms=0                     # a dead holder's memory stays counted this long
    procs_dir=/path                        # registry dir (default: procs/ next to the scenario file)
    gpu_count=8
    gpu.<i>.<key>=<value>                  # see GPU_KEYS; e.g. gpu.3.mem_total_mib=81559
    gpu.<i>.unsupported=ecc_mode,ecc_errors   # these fields answer NVML_ERROR_NOT_SUPPORTED
    gpu.<i>.fail=<field>,<ERROR>           # any error for one field (repeatable)
    gpu.<i>.mig_device=<MIG-uuid>,<gpu instance id>,<compute instance id>[,<mem total MiB>]   (repeatable)
    gpu.<i>.fail=mig.<field>,<ERROR>       # fails the query on the GPU's MIG device handles only
    proc=<pid>,<gpu>,<mem_mib>[,compute|graphics[,<mig slot>]]   # static process (may be a host PID)
    xid=<gpu>,<xid>[,<after_ms>]           # delivered once by nvmlEventSetWait_v2 (see "XIDs" below)
    event_wait_error=UNKNOWN               # nvmlEventSetWait* answers this error at once (a broken event API)
    event_wait_hang=1                      # nvmlEventSetWait* blocks, whatever its timeout, until the line is gone

Field names for `unsupported`/`fail`: see `FIELDS`.

XIDs: each `xid=` line is one event, delivered once per process to an event set that watches its GPU, no
earlier than `after_ms` after the later of the set's creation and the moment the process first read the line.
So a scenario written before a process starts behaves as "after_ms after the set is created" (the gate's
window), and a line added by a rewrite while a long-lived set is polled (the run-time GPU watch) arrives
`after_ms` after the fake notices it. A rewrite that keeps a line (same GPU, code and delay) keeps its state:
an XID already delivered is not delivered again when the test then, say, marks the GPU lost.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

MIB = 1 << 20

# Fields the fake can switch off (NOT_SUPPORTED) or fail with any error, one per NVML query family.
FIELDS: frozenset[str] = frozenset(
    {
        "handle",  # nvmlDeviceGetHandleByIndex
        "index",
        "name",
        "uuid",
        "pci",
        "minor",
        "memory",  # nvmlDeviceGetMemoryInfo and _v2
        "utilization",
        "compute_procs",
        "graphics_procs",
        "compute_mode",
        "persistence",
        "mig_mode",
        "mig_devices",  # max count, MIG handles, instance ids
        "ecc_mode",
        "ecc_errors",  # nvmlDeviceGetTotalEccErrors
        "retired_pages",
        "remapped_rows",
        "clock_events",  # event and throttle reasons
        "temperature",
        "temperature_threshold",
        "power",  # nvmlDeviceGetPowerUsage
        "pcie_width",
        "pcie_width_max",
        "pcie_gen",  # nvmlDeviceGetCurrPcieLinkGeneration
        "pcie_gen_max",  # nvmlDeviceGetMaxPcieLinkGeneration
        "nvlink",  # nvmlDeviceGetNvLinkState and the NVLink field values (link count, link state)
        "field_values",  # the whole nvmlDeviceGetFieldValues call
        "recovery_action",  # the NVML_FI_DEV_GET_GPU_RECOVERY_ACTION field only
        "events",  # register events / supported event types
        "mig.memory",  # the same queries on a MIG device handle (the plain names fail the parent only)
        "mig.compute_procs",
        "mig.graphics_procs",
    }
)

COMPUTE_MODES = ("DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED", "EXCLUSIVE_PROCESS")

# Clock event reason bits (nvml.h nvmlClocksEventReason*).
CLOCK_GPU_IDLE = 0x1
CLOCK_SW_POWER_CAP = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80

# NVML_GPU_RECOVERY_ACTION_*
RECOVERY_NONE = 0
RECOVERY_GPU_RESET = 1
RECOVERY_NODE_REBOOT = 2

# The PCI bus ids of the 8 GPUs of an HGX H100 board (as NVML prints them), in NVML index order.
H100_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_MEM_MIB = 81559  # what NVML reports as total for an H100 80GB HBM3
H100_RESERVED_MIB = 530


def gpu_uuid(seed: str) -> str:
    """A stable, realistic-looking GPU UUID ("GPU-xxxxxxxx-...") derived from `seed`."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"podguard-fake-gpu:{seed}"))


def mig_uuid(seed: str) -> str:
    """A stable MIG device UUID ("MIG-xxxxxxxx-...") as CUDA_VISIBLE_DEVICES takes it."""
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"podguard-fake-mig:{seed}"))


@dataclass
class MigSpec:
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int = 0
    mem_total_mib: int = 0  # 0: the GPU's total divided by its MIG devices


@dataclass
class GpuSpec:
    """One fake GPU. Defaults are an idle, healthy H100 80GB HBM3; `index` fills in UUID/PCI/minor."""

    index: int = 0
    name: str = H100_NAME
    uuid: str = ""
    pci_bus_id: str = ""
    pci_device_id: int = 0x233010DE
    pci_subsys_id: int = 0x16C110DE
    minor: int | None = None
    mem_total_mib: int = H100_MEM_MIB
    mem_reserved_mib: int = H100_RESERVED_MIB
    mem_used_mib: int = 0  # idle baseline (what NVML's v2 "used" shows with no process)
    phantom_mib: int = 0  # used memory that no process accounts for
    util_gpu: int = 0
    util_mem: int = 0
    compute_mode: str = "DEFAULT"
    persistence: bool = True
    mig: bool = False
    mig_devices: list[MigSpec] = field(default_factory=list)
    ecc: bool = True
    ecc_uncorrected_volatile: int = 0
    ecc_corrected_volatile: int = 0
    ecc_uncorrected_aggregate: int = 0
    ecc_corrected_aggregate: int = 0
    retired_pages_pending: bool = False
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    clock_events: int = CLOCK_GPU_IDLE
    clock_events_first: int = CLOCK_GPU_IDLE  # what the first `clock_events_reads` reads answer, per process
    clock_events_reads: int = 0
    temperature_c: int = 33
    temperature_slowdown_c: int = 87
    temperature_shutdown_c: int = 92
    power_mw: int = 70000  # nvmlDeviceGetPowerUsage (milliwatts)
    pcie_width: int = 16
    pcie_width_max: int = 16
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    nvlink_links: int = 18  # NVLink links the GPU has (H100 SXM: 18); 0 = no NVLink (NOT_SUPPORTED)
    nvlink_down: set[int] = field(default_factory=set)  # link ids that are inactive
    recovery_action: int = RECOVERY_NONE
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    fail: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = gpu_uuid(f"h100-{self.index}")
        if not self.pci_bus_id:
            bus = H100_BUS_IDS[self.index] if self.index < len(H100_BUS_IDS) else f"{0xE0 + self.index:02X}"
            self.pci_bus_id = f"00000000:{bus}:00.0"
        if self.minor is None:
            self.minor = self.index

    def lines(self) -> list[str]:
        if self.compute_mode not in COMPUTE_MODES:
            raise ValueError(f"gpu {self.index}: compute_mode {self.compute_mode!r} not in {COMPUTE_MODES}")
        unknown = (set(self.unsupported) | set(self.fail)) - FIELDS
        if unknown:
            raise ValueError(f"gpu {self.index}: unknown fields {sorted(unknown)}; valid: {sorted(FIELDS)}")
        p = f"gpu.{self.index}."
        values: dict[str, object] = {
            "name": self.name,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "pci_device_id": hex(self.pci_device_id),
            "pci_subsys_id": hex(self.pci_subsys_id),
            "minor": self.minor,
            "mem_total_mib": self.mem_total_mib,
            "mem_reserved_mib": self.mem_reserved_mib,
            "mem_used_mib": self.mem_used_mib,
            "phantom_mib": self.phantom_mib,
            "util_gpu": self.util_gpu,
            "util_mem": self.util_mem,
            "compute_mode": self.compute_mode,
            "persistence": int(self.persistence),
            "mig": int(self.mig),
            "ecc": int(self.ecc),
            "ecc_unc_volatile": self.ecc_uncorrected_volatile,
            "ecc_corr_volatile": self.ecc_corrected_volatile,
            "ecc_unc_aggregate": self.ecc_uncorrected_aggregate,
            "ecc_corr_aggregate": self.ecc_corrected_aggregate,
            "retired_pending": int(self.retired_pages_pending),
            "remap_corr": self.remap_correctable,
            "remap_unc": self.remap_uncorrectable,
            "remap_pending": int(self.remap_pending),
            "remap_failure": int(self.remap_failure),
            "clock_events": hex(self.clock_events),
            "clock_events_first": hex(self.clock_events_first),
            "clock_events_reads": self.clock_events_reads,
            "temp": self.temperature_c,
            "temp_slowdown": self.temperature_slowdown_c,
            "temp_shutdown": self.temperature_shutdown_c,
            "power_mw": self.power_mw,
            "pcie_width": self.pcie_width,
            "pcie_width_max": self.pcie_width_max,
            "pcie_gen": self.pcie_gen,
            "pcie_gen_max": self.pcie_gen_max,
            "nvlink_links": self.nvlink_links,
            "nvlink_down": hex(sum(1 << link for link in self.nvlink_down)),
            "recovery_action": self.recovery_action,
            "lost": int(self.lost),
        }
        out = [f"{p}{k}={v}" for k, v in values.items()]
        out += [
            f"{p}mig_device={m.uuid},{m.gpu_instance_id},{m.compute_instance_id},{m.mem_total_mib}"
            for m in self.mig_devices
        ]
        if self.unsupported:
            out.append(f"{p}unsupported={','.join(sorted(self.unsupported))}")
        out += [f"{p}fail={name},{err}" for name, err in sorted(self.fail.items())]
        return out

    @property
    def memory_total(self) -> int:
        return self.mem_total_mib * MIB


@dataclass
class ProcSpec:
    """A process NVML lists regardless of whether it exists locally (e.g. a host PID)."""

    pid: int
    gpu: int
    mem_mib: int
    kind: str = "compute"
    mig: int | None = None  # the MIG slot it runs on


@dataclass
class XidSpec:
    """An XID the fake delivers once, `after_ms` after an event set is created."""

    gpu: int
    xid: int
    after_ms: int = 0


@dataclass
class Scenario:
    """A whole fake node. Mutate it, then `write()` it; the fake picks up the change."""

    gpus: list[GpuSpec] = field(default_factory=list)
    driver_version: str = "550.54.15"
    nvml_version: str = "12.550.54.15"
    cuda_driver_version: int = 12040
    init_error: str | None = None
    procs: list[ProcSpec] = field(default_factory=list)
    xids: list[XidSpec] = field(default_factory=list)
    release_delay_ms: int = 0
    procs_dir: Path | None = None
    event_wait_error: str | None = None  # NVML error name every nvmlEventSetWait* answers (a broken event API)
    event_wait_hang: bool = False  # every nvmlEventSetWait* blocks until a rewrite drops it (NVML not answering)
    description: str = ""

    def gpu(self, index: int) -> GpuSpec:
        return self.gpus[index]

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def to_text(self) -> str:
        lines = ["# podguard fake NVML scenario", "version=1"]
        if self.description:
            lines.append(f"# {self.description}")
        if self.init_error:
            lines.append(f"init_error={self.init_error}")
        lines += [
            f"driver_version={self.driver_version}",
            f"nvml_version={self.nvml_version}",
            f"cuda_version={self.cuda_driver_version}",
            f"release_delay_ms={self.release_delay_ms}",
            f"gpu_count={len(self.gpus)}",
        ]
        if self.procs_dir is not None:
            lines.append(f"procs_dir={self.procs_dir}")
        if self.event_wait_error:
            lines.append(f"event_wait_error={self.event_wait_error}")
        if self.event_wait_hang:
            lines.append("event_wait_hang=1")
        for i, gpu in enumerate(self.gpus):
            if gpu.index != i:
                raise ValueError(f"gpus[{i}] has index {gpu.index}; indices must be 0..n-1 in order")
            lines += gpu.lines()
        lines += [
            f"proc={p.pid},{p.gpu},{p.mem_mib},{p.kind}" + (f",{p.mig}" if p.mig is not None else "")
            for p in self.procs
        ]
        lines += [f"xid={x.gpu},{x.xid},{x.after_ms}" for x in self.xids]
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        """Write atomically (temp file + rename): a reader never sees half a scenario, and the new inode
        tells the fake to re-read even within one mtime tick."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.to_text())
        os.replace(tmp, path)
        return path

    def copy(self, **changes: object) -> Scenario:
        """A deep-enough copy (GPU specs copied) so builders can derive scenarios safely."""
        dup = replace(self, **changes)  # type: ignore[arg-type]
        dup.gpus = [
            replace(
                g,
                mig_devices=list(g.mig_devices),
                unsupported=set(g.unsupported),
                fail=dict(g.fail),
                nvlink_down=set(g.nvlink_down),
            )
            for g in dup.gpus
        ]
        dup.procs = list(dup.procs)
        dup.xids = list(dup.xids)
        return dup


# ------------------------------------------------------------------------------------------------------
# Standard scenarios
# ------------------------------------------------------------------------------------------------------


def healthy_h100(count: int = 8) -> Scenario:
    """An idle HGX H100 node: `count` healthy H100 80GB HBM3 GPUs, driver 550, CUDA 12.4."""
    return Scenario(gpus=[GpuSpec(index=i) for i in range(count)], description=f"healthy {count}xH100")


def fewer_gpus(count: int = 4) -> Scenario:
    """Only `count` GPUs present (a node where 8 were expected)."""
    sc = healthy_h100(count)
    sc.description = f"{count} GPUs present"
    return sc


def exclusive_process(gpu: int = 0, count: int = 8) -> Scenario:
    """One GPU in EXCLUSIVE_PROCESS compute mode: a live process there means its context blocks others."""
    sc = healthy_h100(count)
    sc.gpus[gpu].compute_mode = "EXCLUSIVE_PROCESS"
    sc.description = f"GPU {gpu} exclusive-process"
    return sc


def phantom_memory(gpu: int = 2, mib: int = 2048, count: int = 8) -> Scenario:
    """Used memory on one GPU with no process to account for it (another namespace, a dying context)."""
    sc = healthy_h100(count)
    sc.gpus[gpu].phantom_mib = mib
    sc.description = f"{mib} MiB phantom memory on GPU {gpu}"
    return sc


def ecc_and_remap(ecc_gpu: int = 1, remap_gpu: int = 2, count: int = 8) -> Scenario:
    """Uncorrected volatile ECC errors on one GPU, a pending row remap on another."""
    sc = healthy_h100(count)
    sc.gpus[ecc_gpu].ecc_uncorrected_volatile = 2
    sc.gpus[ecc_gpu].ecc_uncorrected_aggregate = 2
    sc.gpus[ecc_gpu].ecc_corrected_volatile = 14
    sc.gpus[remap_gpu].remap_pending = True
    sc.gpus[remap_gpu].remap_uncorrectable = 1
    sc.description = f"uncorrected ECC on GPU {ecc_gpu}, pending row remap on GPU {remap_gpu}"
    return sc


def remap_failure(gpu: int = 0, count: int = 8) -> Scenario:
    """A failed row remap: the GPU needs a reset or replacement."""
    sc = healthy_h100(count)
    sc.gpus[gpu].remap_failure = True
    sc.gpus[gpu].remap_uncorrectable = 512
    sc.description = f"row remap failure on GPU {gpu}"
    return sc


def retired_pages(gpu: int = 3, count: int = 8) -> Scenario:
    """Retired pages pending on one GPU (needs a reset/reboot to take effect)."""
    sc = healthy_h100(count)
    sc.gpus[gpu].retired_pages_pending = True
    sc.description = f"retired pages pending on GPU {gpu}"
    return sc


def lost_gpu(gpu: int = 5, count: int = 8) -> Scenario:
    """One GPU has fallen off the bus: every query but its PCI info answers GPU_IS_LOST."""
    sc = healthy_h100(count)
    sc.gpus[gpu].lost = True
    sc.description = f"GPU {gpu} lost"
    return sc


def init_failure(error: str) -> Scenario:
    """nvmlInit fails with `error` (an NVML error name, e.g. DRIVER_NOT_LOADED)."""
    sc = healthy_h100(8)
    sc.init_error = error
    sc.description = f"nvmlInit -> {error}"
    return sc


def version_mismatch() -> Scenario:
    """Driver/library mismatch: the container's user-space driver does not match the host kernel module."""
    return init_failure("LIB_RM_VERSION_MISMATCH")


def driver_not_loaded() -> Scenario:
    """The library is there but the kernel module is not loaded."""
    return init_failure("DRIVER_NOT_LOADED")


# What a consumer board (RunPod has many) answers NOT_SUPPORTED for.
CONSUMER_UNSUPPORTED: frozenset[str] = frozenset(
    {
        "ecc_mode",
        "ecc_errors",
        "retired_pages",
        "remapped_rows",
        "mig_mode",
        "mig_devices",
        "recovery_action",
        "events",
        "persistence",
    }
)


def fields_unsupported(count: int = 2) -> Scenario:
    """RTX 4090s on an older driver: ECC, MIG, row remap, retired pages, recovery action, events are n/a.

    Pair with the "old" library variant (`build_fake_nvml(dest, "old")`) to also exercise symbols
    that the driver does not export at all (pynvml's FunctionNotFound)."""
    gpus = [
        GpuSpec(
            index=i,
            name="NVIDIA GeForce RTX 4090",
            uuid=gpu_uuid(f"rtx4090-{i}"),
            pci_bus_id=f"00000000:{0x01 + i * 0x20:02X}:00.0",
            pci_device_id=0x268410DE,
            pci_subsys_id=0x16F110DE,
            mem_total_mib=24564,
            mem_reserved_mib=334,
            ecc=False,
            temperature_slowdown_c=90,
            pcie_gen_max=4,
            nvlink_links=0,
            unsupported=set(CONSUMER_UNSUPPORTED),
        )
        for i in range(count)
    ]
    return Scenario(
        gpus=gpus,
        driver_version="535.104.05",
        nvml_version="12.535.104.05",
        cuda_driver_version=12020,
        description="fields unsupported (consumer GPUs, older driver)",
    )


def mig_enabled(gpu: int = 0, devices: int = 2, count: int = 8) -> Scenario:
    """MIG on for one GPU with `devices` MIG devices (3g.40gb-style instances)."""
    sc = healthy_h100(count)
    g = sc.gpus[gpu]
    g.mig = True
    g.mig_devices = [
        MigSpec(uuid=mig_uuid(f"{gpu}-{i}"), gpu_instance_id=1 + i * 1, compute_instance_id=0) for i in range(devices)
    ]
    g.unsupported.add("utilization")  # the driver does not report utilisation for a GPU in MIG mode
    sc.description = f"MIG enabled on GPU {gpu} with {devices} devices"
    return sc


def mig_unprivileged(gpu: int = 0, devices: int = 2, count: int = 8) -> Scenario:
    """MIG on one GPU, seen from an unprivileged container: the parent GPU answers NO_PERMISSION for its
    memory and process lists; its MIG devices answer for themselves."""
    sc = mig_enabled(gpu, devices, count)
    g = sc.gpus[gpu]
    g.fail.update({"memory": "NO_PERMISSION", "compute_procs": "NO_PERMISSION", "graphics_procs": "NO_PERMISSION"})
    sc.description += " (unprivileged: parent queries NO_PERMISSION)"
    return sc


def slowdown_thermal_link(gpu: int = 0, count: int = 8) -> Scenario:
    """Hardware slowdown while idle, temperature at the slowdown threshold, PCIe link x8 of x16."""
    sc = healthy_h100(count)
    g = sc.gpus[gpu]
    g.clock_events = CLOCK_GPU_IDLE | CLOCK_HW_SLOWDOWN | CLOCK_HW_THERMAL
    g.temperature_c = g.temperature_slowdown_c
    g.pcie_width = 8
    sc.description = f"hw slowdown + thermal + PCIe x8 on GPU {gpu}"
    return sc


def clock_events(gpu: int = 0, events: int = CLOCK_GPU_IDLE | CLOCK_HW_SLOWDOWN, count: int = 8) -> Scenario:
    """One GPU reports these clock event reasons (nvmlClocksEventReason* bits) while idle."""
    sc = healthy_h100(count)
    sc.gpus[gpu].clock_events = events
    sc.description = f"clock event reasons {events:#x} on GPU {gpu}"
    return sc


def transient_clock_events(
    gpu: int = 0, events: int = CLOCK_GPU_IDLE | CLOCK_HW_SLOWDOWN, reads: int = 1, count: int = 8
) -> Scenario:
    """One GPU's first `reads` clock-reason reads (per process) answer `events`, then plain idle: the HW slowdown
    bit nvml.h says "may be also reported during PState or clock change"."""
    sc = healthy_h100(count)
    sc.gpus[gpu].clock_events_first = events
    sc.gpus[gpu].clock_events_reads = reads
    sc.description = f"clock event reasons {events:#x} on GPU {gpu} for {reads} read(s), then idle"
    return sc


def nvlink_bridgeless(name: str = "NVIDIA A40", links: int = 4, count: int = 4) -> Scenario:
    """NVLink-capable PCIe cards without a bridge: NVML reports their links, all inactive."""
    sc = healthy_h100(count)
    for g in sc.gpus:
        g.name, g.nvlink_links, g.nvlink_down = name, links, set(range(links))
        g.pcie_gen = g.pcie_gen_max = 4
    sc.description = f"{count}x {name} without NVLink bridges"
    return sc


def hot(gpu: int = 0, above_c: int = 0, count: int = 8) -> Scenario:
    """One GPU at (or `above_c` degrees above) its slowdown temperature."""
    sc = healthy_h100(count)
    g = sc.gpus[gpu]
    g.temperature_c = g.temperature_slowdown_c + above_c
    sc.description = f"GPU {gpu} at {g.temperature_c}C (slowdown {g.temperature_slowdown_c}C)"
    return sc


def pcie_link(gpu: int = 0, width: int = 8, gen: int = 5, count: int = 8) -> Scenario:
    """One GPU's PCIe link at `width` lanes and generation `gen` (maxima x16, gen 5). A low generation at idle
    is normal power saving; a narrow width is a bad seat, riser or slot."""
    sc = healthy_h100(count)
    sc.gpus[gpu].pcie_width = width
    sc.gpus[gpu].pcie_gen = gen
    sc.description = f"GPU {gpu} PCIe x{width} gen {gen}"
    return sc


def nvlink_down(gpu: int = 0, links: tuple[int, ...] = (3,), count: int = 8) -> Scenario:
    """Some NVLink links of one GPU are inactive (the other GPUs have all 18 up)."""
    sc = healthy_h100(count)
    sc.gpus[gpu].nvlink_down = set(links)
    sc.description = f"NVLink link(s) {list(links)} down on GPU {gpu}"
    return sc


def without_nvlink(count: int = 8) -> Scenario:
    """H100 PCIe cards: no NVLink at all (the NVLink queries answer NOT_SUPPORTED)."""
    sc = healthy_h100(count)
    for g in sc.gpus:
        g.name = "NVIDIA H100 PCIe"
        g.nvlink_links = 0
    sc.description = f"{count}x H100 PCIe without NVLink"
    return sc


def recovery_action(gpu: int = 0, action: int = RECOVERY_GPU_RESET, count: int = 8) -> Scenario:
    """The driver asks for a recovery action (reset/reboot) on one GPU."""
    sc = healthy_h100(count)
    sc.gpus[gpu].recovery_action = action
    sc.description = f"recovery action {action} on GPU {gpu}"
    return sc


def xid(gpu: int = 3, code: int = 79, after_ms: int = 0, count: int = 8) -> Scenario:
    """An XID (79: GPU has fallen off the bus) on one GPU, delivered once via the event API."""
    sc = healthy_h100(count)
    sc.xids.append(XidSpec(gpu=gpu, xid=code, after_ms=after_ms))
    sc.description = f"XID {code} on GPU {gpu}"
    return sc


STANDARD_SCENARIOS = {
    "healthy_h100": healthy_h100,
    "fewer_gpus": fewer_gpus,
    "exclusive_process": exclusive_process,
    "phantom_memory": phantom_memory,
    "ecc_and_remap": ecc_and_remap,
    "remap_failure": remap_failure,
    "retired_pages": retired_pages,
    "lost_gpu": lost_gpu,
    "version_mismatch": version_mismatch,
    "driver_not_loaded": driver_not_loaded,
    "fields_unsupported": fields_unsupported,
    "mig_enabled": mig_enabled,
    "mig_unprivileged": mig_unprivileged,
    "slowdown_thermal_link": slowdown_thermal_link,
    "recovery_action": recovery_action,
    "xid": xid,
    "clock_events": clock_events,
    "hot": hot,
    "pcie_link": pcie_link,
    "nvlink_down": nvlink_down,
    "without_nvlink": without_nvlink,
    "transient_clock_events": transient_clock_events,
    "nvlink_bridgeless": nvlink_bridgeless,
}
