"""Who used this host's CPUs: the host as a whole, the server's processes, the client (/proc).

The one reader of /proc for CPU time. A latency measured on a host the server shares depends
on how much CPU the server got; when other processes (or, on a VM, other guests: steal time)
take some of it, two runs of the same server read differently for a reason neither the client
nor the engine's own histograms can see (both slow down together). What these functions give:

- `host_cpu_times`: busy and total jiffies of all CPUs (/proc/stat; steal counts as busy);
- `local_server_pids`: the processes that listen on a loopback port, with their descendants
  (vLLM's API server and its engine-core process), found through /proc/net/tcp and each
  process's open sockets; empty where the server is not visible from here (another container,
  another user's processes);
- `processes_cpu` and `cpu_ticks_between`: their CPU time, in the same clock ticks as /proc/stat,
  between two snapshots (processes that start, end or reuse a pid in between are handled).

Everything degrades to None or empty off Linux; nothing here raises for a missing /proc.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "CLOCK_TICKS_PER_S",
    "cpu_ticks_between",
    "host_cpu_times",
    "listening_pids",
    "local_server_pids",
    "process_name",
    "processes_cpu",
    "processes_cpu_ticks",
    "with_descendants",
]

_LISTEN = "0A"  # TCP state in /proc/net/tcp
try:
    CLOCK_TICKS_PER_S = float(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):  # not POSIX
    CLOCK_TICKS_PER_S = 100.0


def host_cpu_times(proc_stat: str | Path = "/proc/stat") -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; None where there is no /proc."""
    try:
        with open(proc_stat, encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [float(v) for v in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)  # idle + iowait
    # guest time is already counted in user; leave it out of the total. Steal (the 8th) stays
    # busy: another guest had the CPU.
    total = sum(values[:8])
    return total - idle, total


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            # sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
            if len(f) > 9 and f[3] == _LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes


def _pids(proc: Path) -> list[int]:
    try:
        return [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return []


def _parent_of(pid: int, proc: Path) -> int | None:
    f = _stat_fields(pid, proc)
    return int(f[1]) if f is not None and len(f) > 1 else None


def listening_pids(port: int, proc: str | Path = "/proc") -> frozenset[int]:
    """The processes that hold a socket listening on `port` (empty when none is visible)."""
    root = Path(proc)
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port, root)}
    if not wanted:
        return frozenset()
    owners: set[int] = set()
    for pid in _pids(root):
        try:
            fds = os.listdir(root / str(pid) / "fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(root / str(pid) / "fd" / fd) in wanted:
                    owners.add(pid)
                    break
            except OSError:
                continue
    return frozenset(owners)


def with_descendants(pids: frozenset[int], proc: str | Path = "/proc") -> frozenset[int]:
    """`pids` and every process below them (vLLM's API server starts its engine core, which starts workers)."""
    if not pids:
        return frozenset()
    root = Path(proc)
    children: dict[int, list[int]] = {}
    for pid in _pids(root):
        parent = _parent_of(pid, root)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    tree, todo = set(pids), list(pids)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return frozenset(tree)


def local_server_pids(port: int, proc: str | Path = "/proc") -> frozenset[int]:
    """The processes listening on `port` and all their descendants (empty when none is visible)."""
    return with_descendants(listening_pids(port, proc), proc)


def _stat_fields(pid: int, root: Path) -> list[str] | None:
    try:
        stat = (root / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
    return stat.rsplit(")", 1)[-1].split()


def process_name(pid: int, proc: str | Path = "/proc") -> str:
    """The process's command name (comm), "" when gone."""
    try:
        stat = (Path(proc) / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return stat[stat.find("(") + 1 : stat.rfind(")")]


def processes_cpu(pids: Iterable[int], proc: str | Path = "/proc") -> dict[int, tuple[int, float]]:
    """{pid: (start time, user + system clock ticks so far)} of those of `pids` alive now. The
    start time tells a process from a later one that reused its pid."""
    root, out = Path(proc), {}
    for pid in pids:
        f = _stat_fields(pid, root)
        if f is not None and len(f) > 19:
            # utime, stime, starttime: fields 14, 15 and 22 of the line (the list starts at field 3)
            out[pid] = (int(f[19]), float(f[11]) + float(f[12]))
    return out


def cpu_ticks_between(start: dict[int, tuple[int, float]], end: dict[int, tuple[int, float]]) -> float:
    """Ticks the processes used between two `processes_cpu` snapshots: the growth of those alive at
    both, all of those that started in between (new pids, or a pid reused by a new process); a
    process that ended in between takes its last ticks with it (not counted)."""
    total = 0.0
    for pid, (started, ticks) in end.items():
        before = start.get(pid)
        total += ticks - before[1] if before is not None and before[0] == started else ticks
    return max(total, 0.0)


def processes_cpu_ticks(pids: Iterable[int], proc: str | Path = "/proc") -> float:
    """User + system clock ticks used so far by `pids` (those that have exited count 0)."""
    return sum(ticks for _, ticks in processes_cpu(pids, proc).values())
