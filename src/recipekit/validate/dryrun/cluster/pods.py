"""Local processes standing in for Volcano pods, and the guarantee that none outlives the dry run.

A pod is the Job's container command (the image's launcher) in its own session (so a terminal's Ctrl-C reaches only
recipekit, which then cleans up), with its output in a log file. Killing a pod must kill its whole tree: the
launcher runs torchrun as its child, and torchrun starts its workers with ``start_new_session=True``, so they are in
sessions of their own and a signal to the pod's process group would leave them running (holding ports and the
rendezvous). The tree is therefore walked by parent id and every member is signalled; every process ever seen in a
tree is remembered, so that one reparented to init when its parent died is still found at cleanup.

:class:`PodSet` is a context manager: whatever happens inside (success, failure, an exception, Ctrl-C, SIGTERM to
recipekit), every process it started is gone when the ``with`` block ends; an ``atexit`` hook covers an exit that
skips the block.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil


@dataclass
class Pod:
    """One simulated pod: the Job's container command with the environment Volcano would inject."""

    index: int
    command: list[str]
    cwd: Path
    env: dict[str, str]
    log_path: Path
    #: descriptors the pod inherits: the locks it holds while any of its processes lives (workdir/locks.py)
    pass_fds: tuple[int, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    killed: bool = False
    #: how often the pod was started (the elastic drill checks nobody restarted the pods that were left)
    starts: int = 0
    #: the Job's task this pod belongs to: None for the training task, else its name (an elastic Job's rendezvous)
    task: str | None = None

    def start(self, header: str = "", env: dict[str, str] | None = None) -> None:
        """Start the pod's command (with ``env`` added to the pod's environment for this start only)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            if header:
                log.write(f"\n===== {header} =====\n".encode())
                log.flush()
            self.proc = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env={**self.env, **(env or {})},
                pass_fds=self.pass_fds,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.killed = False
        self.starts += 1
        self.seen = {}
        self.remember()

    def log_size(self) -> int:
        """Bytes in the pod's log so far: where an attempt's part of it begins."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.poll() is None

    def remember(self) -> list[psutil.Process]:
        """The pod's live process tree (pod process and every descendant), added to everything seen so far."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = []
        for process in tree:
            self.seen.setdefault(process.pid, process)
        return tree

    def alive(self) -> list[psutil.Process]:
        """Every process of this pod still running, including orphans of a dead parent."""
        self.remember()
        out = []
        for process in self.seen.values():
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    out.append(process)
            except psutil.Error:
                continue
        return out

    def signal_tree(self, signum: int) -> None:
        for process in self.alive():
            try:
                process.send_signal(signum)
            except psutil.Error:
                pass

    def terminate(self, grace: float) -> None:
        """As Kubernetes deletes a pod: SIGTERM to the container's main process, SIGKILL to all after ``grace``."""
        if self.proc is None:
            return
        self.remember()
        if self.running:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.1)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole tree at once, as a node failure would, and reap the pod process."""
        if self.proc is None:
            return
        self.remember()
        self.signal_tree(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.poll()
        gone_by = time.monotonic() + 10
        while self.alive() and time.monotonic() < gone_by:
            time.sleep(0.05)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        # Progress bars rewrite one line with carriage returns: keep only what a terminal would show last.
        cleaned = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
        return "\n".join(without_launcher_traceback(cleaned)[-lines:])


#: The line that ends torchrun's own traceback when a worker failed; its box with the root cause follows.
_LAUNCHER_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"


def without_launcher_traceback(lines: list[str]) -> list[str]:
    """``lines`` less torchrun's traceback through its own agent, which says only that a worker failed and is long
    enough to push the worker's last words (``terminate called ...``, its own traceback) out of a log's tail. The
    root-cause box after it (rank, exit code, signal) stays."""
    ends = [i for i, line in enumerate(lines) if line.startswith(_LAUNCHER_FAILED)]
    if not ends:
        return lines
    end = ends[-1]
    starts = [i for i in range(end) if lines[i].startswith("Traceback (most recent call last):")]
    return lines if not starts else lines[: starts[-1]] + lines[end:]


class PodSet:
    """The pods of one dry run; leaving the ``with`` block (for any reason) kills every process they started."""

    def __init__(self) -> None:
        self.pods: list[Pod] = []
        self._previous: dict[int, Any] = {}
        atexit.register(self.kill_all)

    def __enter__(self) -> PodSet:
        # SIGTERM / SIGHUP to recipekit become an exception, so the with block's cleanup runs (Ctrl-C already is).
        for signum in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._previous[signum] = signal.signal(signum, _raise_interrupt)
            except (ValueError, OSError):  # not the main thread
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill_all()
        finally:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            atexit.unregister(self.kill_all)

    def add(self, pod: Pod) -> Pod:
        self.pods.append(pod)
        return pod

    def remember(self) -> None:
        for pod in self.pods:
            pod.remember()

    def kill_all(self) -> None:
        for pod in self.pods:
            pod.kill()

    def leftovers(self) -> list[int]:
        """Pids of any process a pod started that is still alive (should be empty after kill_all)."""
        return sorted(p.pid for pod in self.pods for p in pod.alive())


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def loopback_interface() -> str | None:
    """The loopback NIC's name for GLOO_SOCKET_IFNAME (Linux ``lo``, macOS ``lo0``), if there is one."""
    try:
        names = psutil.net_if_addrs()
    except (psutil.Error, OSError):
        return None
    for name, addresses in names.items():
        if any(getattr(a, "address", "") == "127.0.0.1" for a in addresses):
            return name
    return "lo" if os.path.exists("/sys/class/net/lo") else None
