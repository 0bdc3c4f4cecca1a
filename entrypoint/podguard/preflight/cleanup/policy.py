"""The never-touch rules and the name matching the planner and the executor share.

    policy = Policy(table, config)
    policy.excluded(proc)     # (SkipCode.PROTECTED, "protected process (matches 'sshd')") or None
    policy.match.launcher(p)  # "torchrun" or None

The rules in full, with their reasons: docs/cleanup.md.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from podguard.errors import UsageError
from podguard.preflight.cleanup.process_table import ProcessTable, ProcInfo
from podguard.preflight.cleanup.vocabulary import PlanConfig, SkipCode

__all__ = ["BUILTIN_LAUNCHERS", "BUILTIN_PROTECTED", "Matcher", "Policy"]

# Globs matched against a process's names. Sessions people work in, init/supervisors, and GPU monitors
# (which open nvidia<N> through NVML without having a CUDA context).
BUILTIN_PROTECTED: tuple[str, ...] = (
    "sshd",
    "sshd-session",
    "sshd-auth",
    "dropbear",
    "jupyter",
    "jupyter-*",
    "jupyterhub*",
    "ipykernel*",
    "code-server",
    "vscode-server*",
    "tmux*",
    "screen",
    "SCREEN",
    "nginx",
    "tini",
    "dumb-init",
    "catatonit",
    "supervisord",
    "s6-svscan",
    "s6-supervise",
    "runsvdir",
    "runsv",
    "systemd",
    "init",
    "containerd",
    "containerd-shim*",
    "dockerd",
    "runc",
    "cron",
    "crond",
    "nvidia-smi",
    "nvidia-persistenced",
    "nv-hostengine",
    "dcgm*",
    "nvtop",
    "nvitop",
    "gpustat",
    "podguard",
)

# Names of programs that start and babysit GPU workers (and may respawn them).
BUILTIN_LAUNCHERS: tuple[str, ...] = (
    "torchrun",
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate",
    "accelerate-launch",
    "deepspeed",
    "mpirun",
    "mpiexec",
    "orterun",
    "prterun",
    "prted",
    "hydra_pmi_proxy",
    "horovodrun",
)

_NEVER_TEXT = {
    SkipCode.PID1: "PID 1 (the container's init)",
    SkipCode.SELF: "podguard itself",
    SkipCode.ANCESTOR: "an ancestor of podguard",
}


class Matcher:
    """Protected globs, launcher names and caller regexes, compiled once per plan."""

    def __init__(self, protect: Sequence[str], patterns: Sequence[str]) -> None:
        globs = [*BUILTIN_PROTECTED, *(p for p in protect if p)]
        # Most protected names are plain words: a set lookup, no regex to compile on every preflight.
        self.protect_names = {g for g in globs if not any(c in g for c in "*?[")}
        self.protect = [(g, re.compile(fnmatch.translate(g))) for g in globs if g not in self.protect_names]
        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        for pat in patterns:
            if not pat:
                continue
            try:
                self.patterns.append((pat, re.compile(pat)))
            except re.error as exc:
                raise UsageError(
                    f"kill pattern {pat!r} is not a valid regular expression ({exc}); "
                    "patterns are regular expressions searched in full command lines, e.g. 'sglang' or 'python.*train'"
                ) from None

    def protected(self, p: ProcInfo) -> str | None:
        for name in p.names:
            if name in self.protect_names:
                return name
        for glob, rx in self.protect:
            for name in p.names:
                if rx.match(name):
                    return glob
        return None

    def pattern(self, p: ProcInfo) -> str | None:
        if not self.patterns:
            return None
        text = p.command
        for pat, rx in self.patterns:
            if rx.search(text) or rx.search(p.comm):
                return pat
        return None

    def launcher(self, p: ProcInfo) -> str | None:
        """Why `p` is a launcher, or None. Shells only by a caller pattern, and never interactive ones."""
        if p.is_shell:
            return None if p.interactive_shell else self.pattern(p)
        for name in p.names:
            for known in BUILTIN_LAUNCHERS:
                if name == known or name.startswith(known + "."):
                    return known
        return self.pattern(p)


class Policy:
    """Who may never be signalled, for one process table and configuration (shared with the executor,
    which applies the same rule to processes that appear in a job tree while it is being stopped)."""

    def __init__(self, table: ProcessTable, config: PlanConfig) -> None:
        self.config = config
        self.match = Matcher(config.protect, config.patterns)
        self.never: dict[int, SkipCode] = {1: SkipCode.PID1, 0: SkipCode.PID1, config.self_pid: SkipCode.SELF}
        for anc in table.ancestors(config.self_pid):
            self.never.setdefault(anc, SkipCode.ANCESTOR)
        # Every process under another live podguard run's lease belongs to that run's job.
        self.leased: dict[int, int] = {}
        for owner in config.leased:
            if owner in table and owner != config.self_pid:
                self.leased[owner] = owner
                for pid in table.descendants(owner):
                    self.leased.setdefault(pid, owner)

    def excluded(self, p: ProcInfo) -> tuple[SkipCode, str] | None:
        """(code, text) saying why `p` may never be signalled, or None."""
        code = self.never.get(p.pid)
        if code is not None:
            return code, _NEVER_TEXT[code]
        owner = self.leased.get(p.pid)
        if owner is not None:
            who = self.config.leased.get(owner) or f"pid {owner}"
            return SkipCode.LEASED, f"part of another live podguard run (lease held by {who})"
        glob = self.match.protected(p)
        if glob is not None:
            return SkipCode.PROTECTED, f"protected process (matches {glob!r})"
        uid = self.config.uid
        if uid != 0 and p.uid is not None and p.uid != uid:
            return SkipCode.OTHER_USER, f"owned by uid {p.uid}; podguard runs as uid {uid}, not root"
        return None
