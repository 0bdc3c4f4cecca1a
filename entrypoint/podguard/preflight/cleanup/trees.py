"""Steps 4-7 of a cleanup plan: the root of each holder's job tree, the trees, their targets in signal order.

    roots = choose_roots(table, holders, policy, config, respawners)
    trees, claimed, skipped = tree_targets(table, merge_trees(table, roots.roots), holders, roots, policy, respawners)

The job-tree rules and why: docs/cleanup.md ("Job tree").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from podguard.preflight.cleanup.evidence import gpu_list, short, skip_record
from podguard.preflight.cleanup.policy import Policy
from podguard.preflight.cleanup.process_table import ProcessTable, ProcInfo
from podguard.preflight.cleanup.vocabulary import Evidence, Holder, JobTree, PlanConfig, Role, SkipCode, Skipped, Target
from podguard.units import describe_memory

__all__ = ["Roots", "choose_roots", "merge_trees", "pattern_skips", "tree_targets"]


@dataclass
class Roots:
    """Step 4: the root of each stopped holder's job tree, and why each climb step was taken."""

    roots: dict[int, list[int]] = field(default_factory=dict)  # root -> holders that led to it
    why: dict[int, str] = field(default_factory=dict)
    skips: list[Skipped] = field(default_factory=list)


def choose_roots(
    table: ProcessTable,
    holders: Mapping[int, Holder],
    policy: Policy,
    config: PlanConfig,
    respawners: Mapping[int, int],
) -> Roots:
    out = Roots()
    selected = set(config.gpus)
    for pid in sorted(holders):
        h = holders[pid]
        if h.evidence is Evidence.NVML:
            continue
        p = table.procs[pid]
        why_not = policy.excluded(p)
        if why_not is not None:
            code, text = why_not
            out.skips.append(skip_record(p, code, f"holds {gpu_list(h.gpus)} but is {text}: not stopped", h.gpus))
            continue
        if not config.all_gpus and not selected.intersection(h.gpus):
            out.skips.append(
                skip_record(p, SkipCode.UNSELECTED_GPU, f"holds only {gpu_list(h.gpus)}, outside the selection", h.gpus)
            )
            continue
        root = _climb(table, p, holders, policy, respawners, out.why)
        out.roots.setdefault(root, []).append(pid)
    return out


def _climb(
    table: ProcessTable,
    h: ProcInfo,
    holders: Mapping[int, Holder],
    policy: Policy,
    respawners: Mapping[int, int],
    why: dict[int, str],
) -> int:
    """The root of `h`'s job tree (docs/cleanup.md, "Job tree"). Records why each step was taken."""
    chain = table.ancestors(h.pid)
    leader = table.get(h.pgid)
    group_ok = (
        leader is not None
        and (leader.pid == h.pid or leader.pid in chain)
        and not leader.is_shell
        and policy.excluded(leader) is None
    )
    cur = h
    for ppid in chain:
        parent = table.get(ppid)
        if parent is None or parent.zombie or parent.interactive_shell or policy.excluded(parent) is not None:
            break
        if respawners.get(ppid) == parent.start_time:
            reason = "seen starting a new holder after its previous child was stopped"
        elif ppid in holders and holders[ppid].evidence is not Evidence.NVML:
            reason = "holds a GPU itself"
        elif (name := policy.match.launcher(parent)) is not None:
            reason = f"matches launcher {name!r}"
        elif group_ok and parent.pgid == h.pgid and not parent.is_shell:
            reason = f"same process group {h.pgid} as holder {h.pid}"
        else:
            break
        why.setdefault(ppid, reason)
        cur = parent
    return cur.pid


def merge_trees(table: ProcessTable, roots: Mapping[int, list[int]]) -> dict[int, list[int]]:
    """Step 5: a tree that contains another tree's root absorbs it."""
    root_set = set(roots)
    merged: dict[int, list[int]] = {}
    for root in sorted(roots):
        top = root
        for anc in table.ancestors(root):
            if anc in root_set:
                top = anc
        merged.setdefault(top, []).extend(roots[root])
    return merged


def _members(table: ProcessTable, root: int, policy: Policy) -> tuple[list[int], list[Skipped]]:
    """Descendants of `root` top-down, leaving out (and reporting) excluded processes and their subtrees."""
    out: list[int] = []
    skips: list[Skipped] = []
    frontier = [root]
    while frontier:
        nxt: list[int] = []
        for parent in frontier:
            for child in table.children(parent):
                p = table.procs[child]
                if p.zombie:
                    continue
                why_not = policy.excluded(p)
                if why_not is not None:
                    code, text = why_not
                    skips.append(
                        skip_record(p, code, f"in the job tree of {root} but is {text}: left running with its subtree")
                    )
                    continue
                out.append(child)
                nxt.append(child)
        frontier = nxt
    return out, skips


def _holder_reason(h: Holder, selected: set[int]) -> str:
    parts = []
    for g in h.gpus:
        mem = h.memory.get(g)
        if mem is not None:
            note = f"NVML {describe_memory(mem)}"
        elif h.evidence is Evidence.FD_CUDA:
            note = "a CUDA context open; NVML lists only PIDs of another PID namespace there"
        else:
            note = "below a process NVML lists there"
        parts.append(f"GPU{g} (nvidia device file open; {note})")
    text = "holds " + ", ".join(parts)
    outside = [g for g in h.gpus if g not in selected]
    if outside:
        text += f"; {gpu_list(outside)} outside the selection go with its job"
    return text


def _target(
    table: ProcessTable,
    pid: int,
    root: int,
    holders: Mapping[int, Holder],
    roots: Roots,
    config: PlanConfig,
    tree_holders: tuple[int, ...],
    respawners: Mapping[int, int],
) -> Target:
    p = table.procs[pid]
    h = holders.get(pid)
    if h is not None:
        role, reason = Role.HOLDER, _holder_reason(h, set(config.gpus))
        if pid == root and pid in roots.why:
            reason += f"; root of the job tree ({roots.why[pid]})"
    elif pid == root:
        role = Role.RESPAWNER if respawners.get(pid) == p.start_time else Role.LAUNCHER
        reason = f"{role.value} of holder(s) {', '.join(map(str, tree_holders))} ({roots.why.get(pid, 'root')})"
    else:
        role = Role.MEMBER
        reason = f"in the job tree of {root} ({short(table.procs[root].safe_command, 60)})"
    parent = table.get(p.ppid)
    return Target(
        pid=pid,
        start_time=p.start_time,
        cmdline=short(p.safe_command),
        name=p.display_name,
        role=role,
        tree=root,
        reason=reason,
        gpus=h.gpus if h else (),
        memory=dict(h.memory) if h else {},
        uid=p.uid,
        parent=p.ppid,
        parent_start=parent.start_time if parent is not None else 0,
    )


def tree_targets(
    table: ProcessTable,
    merged: Mapping[int, list[int]],
    holders: Mapping[int, Holder],
    roots: Roots,
    policy: Policy,
    respawners: Mapping[int, int],
) -> tuple[list[JobTree], set[int], list[Skipped]]:
    """Step 6: each tree's targets in signal order; the pids claimed by some tree."""
    trees: list[JobTree] = []
    claimed: set[int] = set()
    skips: list[Skipped] = []
    for root in sorted(merged):
        members, left_out = _members(table, root, policy)
        skips.extend(left_out)
        tree_holders = tuple(sorted(set(merged[root])))
        targets = []
        for pid in [root, *members]:
            if pid not in claimed:
                claimed.add(pid)
                targets.append(_target(table, pid, root, holders, roots, policy.config, tree_holders, respawners))
        if targets:
            trees.append(JobTree(root, tuple(targets), tree_holders))
    return trees, claimed, skips


def pattern_skips(table: ProcessTable, policy: Policy, claimed: set[int], seen: set[int]) -> list[Skipped]:
    """Step 7: patterns only widen; a match outside every tree is reported, never touched."""
    if not policy.match.patterns:
        return []
    out = []
    for p in table:
        if p.pid in claimed or p.pid in seen or p.pid in policy.never or p.kernel_thread or p.zombie:
            continue
        pat = policy.match.pattern(p)
        if pat is not None:
            reason = (
                f"matches pattern {pat!r} but is not in the job tree of any process holding a selected GPU: not stopped"
            )
            out.append(skip_record(p, SkipCode.PATTERN_OUTSIDE_TREE, reason))
    return out
