"""The PSS (proportional set size) of a process tree, for bench.py --sqlite-memory (issue 36): the
sum of /proc/PID/smaps_rollup's Pss over a process and its descendants, polled while it runs. PSS
counts a page shared by N processes as 1/N in each, so the sum over a tree is the memory the tree
takes, and pages that forked workers copied on write count once per copy. Standard library only:
the process that measures must not map torch's libraries itself, or it would take a share of the
tree's pages."""

from __future__ import annotations

import os
import threading


def _parents() -> dict:
    """{pid: parent pid} of every process now."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        found[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return found


def process_tree(pid: int) -> list:
    """`pid` and its descendants."""
    children = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def pss_kb(pid: int) -> int:
    """A process's proportional set size (kB): each page it maps counted as its share among the
    processes that map it. 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_pss_kb(pid: int) -> tuple:
    """(PSS of `pid` and its descendants in kB, the number of processes)."""
    tree = process_tree(pid)
    return sum(pss_kb(p) for p in tree), len(tree)


class PeakPss:
    """Polls the PSS of a process tree every `interval` seconds on a thread of its own, while in
    a ``with`` block: .peak_kb and .processes (the tree's size then), .most_processes (the
    largest tree seen), .polls."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval = pid, interval
        self.peak_kb = self.processes = self.most_processes = self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="pss-poll")

    def _poll(self) -> None:
        while True:
            kb, processes = tree_pss_kb(self.pid)
            self.polls += 1
            self.most_processes = max(self.most_processes, processes)
            if kb > self.peak_kb:
                self.peak_kb, self.processes = kb, processes
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "PeakPss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
