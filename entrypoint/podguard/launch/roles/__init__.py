"""roles mode: a TOML job file splits the selected GPUs between roles started in dependency order.

    from podguard.launch.roles import load_roles, run_roles
    outcome = run_roles(load_roles("job.toml", selection, master_port=29500), selection, master_port=29500)

The job-file guide: docs/roles.md.
"""

from podguard.launch.roles.config import ReadyCheck, ReadyKind, Role, RolesPlan, load_roles, parse_roles
from podguard.launch.roles.controller import READY_TIMEOUT_EXIT, RolesController, run_roles

__all__ = [
    "READY_TIMEOUT_EXIT",
    "ReadyCheck",
    "ReadyKind",
    "Role",
    "RolesController",
    "RolesPlan",
    "load_roles",
    "parse_roles",
    "run_roles",
]
