"""Which network interface holds an address, and the socket-interface defaults the workers get from it.

    interface_holding("10.65.0.2")                   # "ens1" on a RunPod cluster node; None if none here
    env, note = socket_ifname_env(os.environ)        # {"NCCL_SOCKET_IFNAME": "ens1", "GLOO_SOCKET_IFNAME": ...}

Standard library only: IPv4 through the SIOCGIFADDR ioctl over `socket.if_nameindex()`, IPv6 from
/proc/net/if_inet6. Why the cluster network and never eth0: docs/clusters-in-node.md.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping
from pathlib import Path

__all__ = ["IFNAME_VARS", "interface_holding", "socket_ifname_env"]

IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (primary) IPv4 address
IF_INET6 = Path("/proc/net/if_inet6")


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def _ipv4_address(sock: socket.socket, name: str) -> str | None:
    try:
        answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    except OSError:  # no IPv4 address on this interface (or it vanished)
        return None
    return socket.inet_ntoa(answer[20:24])  # struct ifreq: 16-byte name, then sockaddr_in (family, port, addr)


def _ipv4_owner(ip: ipaddress.IPv4Address) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            if _ipv4_address(sock, name) == str(ip):
                return name
    return None


def _ipv6_owner(ip: ipaddress.IPv6Address, table: Path = IF_INET6) -> str | None:
    """/proc/net/if_inet6: `<32 hex digits> <ifindex> <prefix len> <scope> <flags> <name>` per address."""
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and len(fields[0]) == 32 and ipaddress.IPv6Address(int(fields[0], 16)) == ip:
            return fields[5]
    return None


def interface_holding(address: str) -> str | None:
    """The name of the local interface that holds `address` (an IP literal); None when none does."""
    ip = _ip(address)
    if ip is None:
        return None
    if isinstance(ip, ipaddress.IPv4Address):
        return _ipv4_owner(ip)
    return _ipv6_owner(ip)


def _nccl_name(name: str) -> str:
    """NCCL matches NCCL_SOCKET_IFNAME as a prefix ("ens1" also picks ens10): exact ("=ens1") only when
    another interface's name starts with this one, so the common case reads as RunPod documents it."""
    others = [n for _, n in socket.if_nameindex() if n != name and n.startswith(name)]
    return f"={name}" if others else name


def socket_ifname_env(environ: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for the workers, each decided on its own: the interface holding
    NODE_ADDR for each variable the user did not set (when NODE_ADDR is set). RunPod's docs tell users to
    export NCCL_SOCKET_IFNAME=ens1; gloo must still be pinned then. Returns (variables, the summary's line)."""
    node_addr = (environ.get("NODE_ADDR") or "").strip()
    if not node_addr:
        return {}, None
    kept = [v for v in IFNAME_VARS if environ.get(v)]
    missing = [v for v in IFNAME_VARS if v not in kept]
    yours = ", ".join(f"{v}={environ[v]}" for v in kept) + " (yours, kept)" if kept else ""
    if not missing:
        return {}, f"socket interface: {yours}"
    name = interface_holding(node_addr)
    if name is None:
        return {}, (
            f"warning: no interface here holds NODE_ADDR={node_addr}; {'/'.join(missing)} left unset "
            "(NCCL and gloo pick one themselves)" + (f"; {yours}" if yours else "")
        )
    chosen = {"NCCL_SOCKET_IFNAME": _nccl_name(name), "GLOO_SOCKET_IFNAME": name}
    env = {v: chosen[v] for v in missing}
    line = f"socket interface: {name} (holds NODE_ADDR={node_addr}) -> {', '.join(missing)}"
    return env, line + (f"; {yours}" if yours else "")
