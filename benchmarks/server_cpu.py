"""CPU seconds of a local MongoDB-wire server: where a store benchmark's time goes.

    ServerCpu.find("mongodb://127.0.0.1:P/")  # None when no local process listens on P

The server is the process listening on the URL's port (found through ``/proc/net/tcp``
and the processes' socket descriptors, so it must be this user's). For FerretDB on
PostgreSQL (``--postgresql-url=...`` in its command line) the PostgreSQL cluster
listening on that URL's port is counted beside it: the postmaster, the CPU of its
children that exited (``cutime``/``cstime``: it reaps them) and of those alive now
(FerretDB's pooled connections). Linux only; read-only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

TICKS = os.sysconf("SC_CLK_TCK")


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(fields[9])
    return inodes


def listener_pid(port: int) -> int | None:
    """The process listening on ``port`` on this machine (``None``: none of ours)."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(pid: int) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int(_stat(int(proc.name))[1]) == pid:
                    out.append(int(proc.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


class ServerCpu:
    """The CPU seconds so far of a server's processes, by part (``seconds()``)."""

    def __init__(self, parts: dict[str, int]) -> None:
        self.parts = parts  # name -> pid: "ferretdb", "postgresql" (its postmaster)

    @classmethod
    def find(cls, url: str) -> ServerCpu | None:
        port = urlsplit(url).port or 27017
        pid = listener_pid(port)
        if pid is None:
            return None
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        parts = {name: pid}
        for arg in command:
            found = re.match(rb"--postgresql-url=.*?:(\d+)/", arg)
            if found:
                postmaster = listener_pid(int(found.group(1)))
                if postmaster is not None:
                    parts["postgresql"] = postmaster
        return cls(parts)

    def seconds(self) -> dict[str, float]:
        out = {}
        for name, pid in self.parts.items():
            try:
                fields = _stat(pid)
            except OSError:
                out[name] = float("nan")
                continue
            ticks = int(fields[11]) + int(fields[12])
            if name == "postgresql":  # its backends: the reaped ones and the live ones
                ticks += int(fields[13]) + int(fields[14])
                for child in _children(pid):
                    try:
                        child_fields = _stat(child)
                    except OSError:
                        continue
                    ticks += int(child_fields[11]) + int(child_fields[12])
            out[name] = ticks / TICKS
        return out
