"""What a person would call a process: comm, argv[0], and the script or `-m` module an interpreter runs.

    names_of("python3", ("python3", "-m", "torch.distributed.run", "train.py"))
    # frozenset({"python3", "torch.distributed.run"})

The planner matches protected globs and launcher names against these (see docs/cleanup.md).
"""

from __future__ import annotations

import os
import re

__all__ = ["SHELLS", "names_of"]

# Programs that run other programs; `names_of` looks through them to the script or module they run.
_INTERPRETERS = re.compile(r"^(python[0-9.]*m?|pypy[0-9.]*|node|nodejs|perl|ruby|env|uv|uvx)$")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "tcsh", "csh", "ash", "busybox"})
_PY_OPTS_WITH_ARG = frozenset({"-W", "-X", "-Q"})


def _skip_options(prog: str, argv: tuple[str, ...], i: int, names: set[str]) -> int | None:
    """Index of the program an interpreter at argv[i-1] runs; None when it runs `-m`/`-c` (recorded)."""
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" and i + 1 < len(argv):
            names.add(argv[i + 1])
            return None
        if arg.startswith("-m") and len(arg) > 2:
            names.add(arg[2:])
            return None
        if arg.startswith("-c"):
            return None
        if arg in _PY_OPTS_WITH_ARG:
            i += 2
            continue
        if arg.startswith("-") or (prog == "env" and "=" in arg) or (prog in ("uv", "uvx") and arg == "run"):
            i += 1
            continue
        return i
    return None


def names_of(comm: str, argv: tuple[str, ...]) -> frozenset[str]:
    """Every name a person would call this process by: comm, argv[0], and what an interpreter runs.

    `python -m torch.distributed.run` -> {"python3", "torch.distributed.run", ...};
    `/usr/bin/python3 /usr/local/bin/jupyter-lab` -> {"python3", "jupyter-lab"}; `-bash` -> {"bash"}.
    """
    names = {comm}
    i: int | None = 0
    for _hop in range(3):  # env python3 -u script.py: at most a few hops
        if i is None or i >= len(argv):
            break
        prog = os.path.basename(argv[i]).lstrip("-")
        if not prog:
            break
        names.add(prog)
        if not _INTERPRETERS.match(prog):
            break
        i = _skip_options(prog, argv, i + 1, names)
    return frozenset(n for n in names if n)
