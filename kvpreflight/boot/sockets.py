"""The listening TCP sockets of the processes kvpreflight booted, read from /proc (Linux): each
process's socket inodes (the /proc/PID/fd links `socket:[INODE]`) matched to the rows of
/proc/net/tcp and tcp6 in state LISTEN. Read while the engines run: what a process binds is the
truth, whatever its log says (Mooncake logs "listening on 127.0.0.1:N" and binds 0.0.0.0:N)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass

from kvpreflight._internal.files import FileKind, read_bytes, read_system
from kvpreflight.errors import ConfigError

LISTEN = "0A"  # the kernel's TCP_LISTEN in the `st` column
MAX_FDS = 65536  # a process's descriptors looked at, at most


@dataclass(frozen=True)
class ListeningSocket:
    pid: int
    program: str  # /proc/PID/comm
    address: str  # "0.0.0.0", "::", "127.0.0.1", ...
    port: int


class SocketsUnreadable(Exception):
    """/proc's socket tables cannot be read here (not Linux, or /proc hidden)."""


def listening_rows(text: str) -> dict[int, tuple[str, int]]:
    """/proc/net/tcp or tcp6 text -> {inode: (address, port)} of its listening sockets."""
    rows: dict[int, tuple[str, int]] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN or ":" not in fields[1]:
            continue
        hex_address, _, hex_port = fields[1].partition(":")
        try:
            rows[int(fields[9])] = (_address(hex_address), int(hex_port, 16))
        except ValueError:
            continue
    return rows


def _address(hex_address: str) -> str:
    """The kernel writes each 32-bit word of the address in host byte order (little-endian here)."""
    words = [bytes.fromhex(hex_address[i:i + 8])[::-1] for i in range(0, len(hex_address), 8)]
    packed = b"".join(words)
    if len(packed) == 4:
        return str(ipaddress.IPv4Address(packed))
    address = ipaddress.IPv6Address(packed)
    return str(address.ipv4_mapped) if address.ipv4_mapped is not None else str(address)


def socket_inodes(pid: int, root: str = "/proc") -> set[int]:
    """The inodes of the sockets process `pid` holds open (nothing if it is gone or hidden)."""
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"{root}/{pid}/fd")[:MAX_FDS]
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"{root}/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]") and target[8:-1].isdigit():
            inodes.add(int(target[8:-1]))
    return inodes


def listening(pids: Iterable[int], root: str = "/proc") -> tuple[ListeningSocket, ...]:
    """The listening TCP sockets that the processes `pids` hold, ordered by port."""
    rows: dict[int, tuple[str, int]] = {}
    for table in ("tcp", "tcp6"):
        path = f"{root}/net/{table}"
        if not os.path.exists(path):
            continue
        try:
            rows.update(listening_rows(read_bytes(path, FileKind.SOCKET_TABLE).decode("ascii", "replace")))
        except ConfigError as exc:  # the bounded reader's one line
            raise SocketsUnreadable(f"{path} cannot be read ({exc})") from None
    if not rows and not os.path.exists(f"{root}/net/tcp"):
        raise SocketsUnreadable(f"{root}/net/tcp does not exist (not Linux?)")
    found = []
    for pid in sorted(set(pids)):
        program = (read_system(f"{root}/{pid}/comm") or "?").strip()
        for inode in socket_inodes(pid, root):
            if inode in rows:
                address, port = rows[inode]
                found.append(ListeningSocket(pid, program, address, port))
    return tuple(sorted(set(found), key=lambda s: (s.port, s.address, s.pid)))
