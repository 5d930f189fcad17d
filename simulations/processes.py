"""The processes a run starts, by PID (Linux ``/proc``): find a tree, end it cleanly.

Used by the in-process engine (``simulations.run``: Ray's processes below this one) and by
the Simulation Runtime (``simulations.runtime``: a SuperLink and what it spawns). Each
process is followed with its start time, so one orphaned by its parent's exit is still
found and ended, and a reused PID never is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in ticks) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[19])


def alive(pid: int, started: int) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` (not a zombie)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z" and stat[2] == started


def process_tree(pid: int) -> dict[int, int]:
    """``pid`` and every live process below it, each with its start time."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir("/proc"):
        stat = proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and stat[0] != "Z":  # a zombie has ended; its parent reaps it
            children.setdefault(stat[1], []).append((int(entry.name), stat[2]))
    root = proc_stat(pid)
    out = {pid: root[2]} if root is not None and root[0] != "Z" else {}
    todo = [pid]
    while todo:
        for child, started in children.get(todo.pop(), []):
            out[child] = started
            todo.append(child)
    return out


def descendants(pid: int | None = None) -> dict[int, int]:
    """Every live process below ``pid`` (default: this one) and its start time."""
    root = os.getpid() if pid is None else pid
    return {p: s for p, s in process_tree(root).items() if p != root}


def terminate(
    find: Callable[[Mapping[int, int]], Mapping[int, int]], grace_s: float, poll_s: float = 0.05
) -> dict[int, int]:
    """SIGTERM every process ``find(seen)`` names (again for any that appears meanwhile,
    e.g. a dying raylet's workers), then SIGKILL those still alive after ``grace_s``;
    returns every process it signalled (PID → start time)."""
    seen: dict[int, int] = {}
    deadline = time.monotonic() + grace_s
    left: list[int] = []
    while True:
        for pid, started in dict(find(seen)).items():
            if pid not in seen:
                seen[pid] = started
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
        left = [pid for pid, started in seen.items() if alive(pid, started)]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return seen
