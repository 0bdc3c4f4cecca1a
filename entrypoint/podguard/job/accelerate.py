"""Make podguard's port lease reach `accelerate launch`, which ignores MASTER_PORT and takes its rendezvous port
only from `--main_process_port` or its config file's `main_process_port` (accelerate/commands/launch.py,
`_validate_launch_command`; accelerate/utils/launch.py sets MASTER_PORT for its workers from that argument and
falls back to 29500). Without this, two jobs on one node both take 29500.

    argv = with_main_process_port(["accelerate", "launch", "train.py"], 29612)
    # ["accelerate", "launch", "--main_process_port", "29612", "train.py"]
"""

from __future__ import annotations

import os

__all__ = ["is_accelerate_launch", "with_main_process_port"]

_FLAG = "--main_process_port"


def _launch_index(argv: tuple[str, ...] | list[str]) -> int | None:
    """The index of `launch` in `accelerate launch ...` / `python -m accelerate.commands.launch ...`."""
    if len(argv) >= 2 and os.path.basename(argv[0]) == "accelerate" and argv[1] == "launch":
        return 1
    if len(argv) < 3 or not os.path.basename(argv[0]).startswith("python") or argv[1] != "-m":
        return None
    if argv[2] == "accelerate.commands.launch":
        return 2
    if argv[2] == "accelerate.commands.accelerate_cli" and len(argv) > 3 and argv[3] == "launch":
        return 3
    return None


def is_accelerate_launch(argv: tuple[str, ...] | list[str]) -> bool:
    return _launch_index(argv) is not None


def with_main_process_port(argv: tuple[str, ...] | list[str], port: int) -> tuple[str, ...]:
    """`argv` with `--main_process_port PORT` after `launch`, unless it is not an accelerate launch or the user
    gave the port (or a config file, which may set it) themselves."""
    at = _launch_index(argv)
    if at is None:
        return tuple(argv)
    # accelerate's own options end at the script; a valued option (`--num_processes 2`) hides where, so the
    # options run to the first `*.py` (or `--`), else to the end
    script_at = next((i for i, a in enumerate(argv) if i > at and (a.endswith(".py") or a == "--")), len(argv))
    own = argv[at + 1 : script_at]
    if any(a == _FLAG or a.startswith(f"{_FLAG}=") or a.startswith("--config_file") for a in own):
        return tuple(argv)
    return (*argv[: at + 1], _FLAG, str(port), *argv[at + 1 :])
