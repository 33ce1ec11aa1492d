"""Locks a process holds, not files that say so: ``fcntl.flock`` on an open file, released by the kernel when the
last process holding the file open dies.

torch's ``FileBaton`` (the lock DeepSpeed's op builder builds under) takes a file's existence as the lock, so a build
killed between creating and removing it leaves every later build waiting forever. The dry run's own locks (the work
directory, the extension cache) are therefore flocks: a lock whose holders are all dead is free, whatever is left on
disk. A lock's file holds one line naming its newest holder (PID and start time), for the message of whoever waits.
The descriptor can be handed to child processes (``pass_fds``), so that the lock stays held while any of them lives.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from recipekit.validate.dryrun.options import DryRunUsageError

#: The most of a lock file's holder line that is read back (it is one short line).
_HOLDER_BYTES = 200


@dataclass
class FileLock:
    """An open lock file and the flock this process holds on it (``shared`` or exclusive)."""

    path: Path
    fd: int
    shared: bool

    @classmethod
    def open(cls, path: Path) -> FileLock:
        """Open (create) ``path`` for locking, without following a link or opening a FIFO or device."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        if not _is_regular(fd):
            os.close(fd)
            raise OSError(f"{path}: not a regular file")
        return cls(path, fd, shared=False)

    def try_lock(self, shared: bool = False) -> bool:
        """Take (or convert to) the lock without waiting; False when another process holds it."""
        try:
            fcntl.flock(self.fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.shared = shared
        return True

    def lock(self, shared: bool = False) -> None:
        """Take (or convert to) the lock, waiting for the holders of a conflicting one to release it or die."""
        fcntl.flock(self.fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        self.shared = shared

    def unlock(self) -> None:
        """Let go of the lock, keeping the file open (to take it again)."""
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def write_holder(self, what: str) -> None:
        """Name this process as the holder (its PID and start time, then ``what``), replacing the line before."""
        line = f"PID {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {what}\n"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, line.encode("utf-8", "replace"), 0)

    def holder(self) -> str:
        """The newest holder's PID and start time, or "" (bounded, control characters dropped)."""
        try:
            data = os.pread(self.fd, _HOLDER_BYTES, 0)
        except OSError:
            return ""
        text = data.decode("utf-8", "replace").splitlines()[0].split(";")[0] if data else ""
        return "".join(c for c in text if c.isprintable()).strip()

    def close(self) -> None:
        """Release this process's hold (children given the descriptor keep theirs)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def claim_workdir(root: Path, marker: str) -> FileLock:
    """Hold ``root`` (a dry run's work directory) for this run, or raise DryRunUsageError naming the run that holds
    it. The lock is ``root/marker``, the file that marks the directory as a dry run's: it is never removed, so
    every run locks the same file; the caller empties the rest of the directory once it holds it."""
    root.mkdir(parents=True, exist_ok=True)
    try:
        lock = FileLock.open(root / marker)
    except OSError as exc:
        raise DryRunUsageError(f"--workdir {root}: cannot open {marker} ({exc.strerror or exc})") from None
    if not lock.try_lock():
        holder = lock.holder() or "its PID unknown"
        lock.close()
        raise DryRunUsageError(
            f"--workdir {root} is in use by another dry run ({holder}, or pods it left running): wait for it to "
            "end, or give this one its own --workdir"
        )
    lock.write_holder("recipekit validate --dry-run (this directory is safe to delete when no dry run uses it)")
    return lock
